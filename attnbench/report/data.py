"""Result rows as a report sees them: read from files, grouped by the machine that measured
them (never merged across machines), and the few derived quantities every section needs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.report.sweep_tables import TRIAL_KINDS
from attnbench.results import read_rows, result_files
from attnbench.units import format_gib

UNKNOWN_MACHINE = "unknown machine"


@dataclass
class Results:
    source: Path
    files: list[Path]
    rows: list[dict[str, Any]]
    problems: list[str]  # one line per unreadable line: FILE:LINE: why
    by_machine: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def machine_of(row: dict[str, Any]) -> str:
    return (row.get("env") or {}).get("machine") or UNKNOWN_MACHINE


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def load(path: Path) -> Results:
    """Every readable row under ``path``; bad input (nothing to read) is one-line error."""
    path = Path(path)
    files = result_files(path)  # raises when the path does not exist
    if not files:
        raise AttnbenchError(
            f"no trials.jsonl under {path}: run e.g. `attnbench run --profile auto --out {path}` first"
        )
    rows, problems = read_rows(path)
    if not rows:
        raise AttnbenchError(
            f"{path} holds no readable result rows ({len(problems)} unreadable lines in "
            f"{len(files)} files): run `attnbench run --profile auto --out DIR` and report on DIR"
        )
    rows = separate_memory_limits([{**r, "label": compact_label(r)} if r.get("label") else r for r in rows])
    rows = separate_code_versions(rows)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(machine_of(r), []).append(r)
    return Results(path, files, rows, problems, groups)


def short_commit(row: dict[str, Any]) -> str:
    commit = str((row.get("env") or {}).get("commit") or "unknown")
    head, _, dirty = commit.partition("-")
    return head[:9] + (f"-{dirty}" if dirty else "")


def separate_memory_limits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A configuration swept both on the whole GPU and under an allocator limit
    (``memory_limit``), or under two limits, is one series per limit, each limited one
    labelled with its limit: a capacity under a limit is the limit's, not the GPU's, and never
    pools with or supersedes another. Trials carry the limit; the run's other rows of that
    series (its max-seq result) follow them."""
    limits = {
        (r.get("run"), r["series"]): r.get("memory_limit")
        for r in rows
        if r.get("kind") in TRIAL_KINDS and r.get("series")
    }
    per_series: dict[str, set] = {}
    for (_, series), limit in limits.items():
        per_series.setdefault(series, set()).add(limit)
    mixed = {series for series, seen in per_series.items() if len(seen) > 1}

    def rekey(r: dict[str, Any]) -> dict[str, Any]:
        limit = limits.get((r.get("run"), r.get("series")))
        if r.get("series") not in mixed or not limit:
            return r
        return {
            **r,
            "series": f"{r['series']}~{limit}",
            "label": f"{r.get('label') or r.get('impl')} under {format_gib(limit)}",
        }

    return [rekey(r) for r in rows] if mixed else rows


def separate_code_versions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A series measured by several versions of the code is several series: trials of
    different code never pool into one search, one table or one fit (a before-and-after
    pair in one results tree stays a pair). Rows of such a series get the commit in their
    series key and label; series measured by one commit keep theirs."""
    commits: dict[tuple[str, str], dict[str, str]] = {}  # series -> commit -> its newest row's date
    for r in rows:
        if r.get("series"):
            dates = commits.setdefault((machine_of(r), r["series"]), {})
            dates[short_commit(r)] = max(dates.get(short_commit(r), ""), row_date(r))
    split = {key: superseded_by(dates) for key, dates in commits.items() if len(dates) > 1}
    if not split:
        return rows

    def relabel(r: dict[str, Any]) -> dict[str, Any]:
        newest = split[(machine_of(r), r["series"])]
        mine = short_commit(r)
        later = f" (superseded by {newest})" if newest and newest != mine else ""
        return {**r, "series": f"{r['series']}@{mine}", "label": f"{r.get('label') or r.get('impl')} @ {mine}{later}"}

    return [relabel(r) if (machine_of(r), r.get("series")) in split else r for r in rows]


def row_date(row: dict[str, Any]) -> str:
    return str((row.get("env") or {}).get("date") or "")


def superseded_by(dates: dict[str, str]) -> str | None:
    """The commit whose rows are strictly the newest: it supersedes the series' other commits."""
    ranked = sorted(dates.items(), key=lambda kv: kv[1])
    return ranked[-1][0] if ranked[-1][1] > ranked[-2][1] else None


# --- row accessors ------------------------------------------------------------------------


def trials(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("kind") in TRIAL_KINDS]


def ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def world_size(row: dict[str, Any]) -> int:
    return int(row.get("world_size") or 1)


def gpu_memory(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Per GPU: index, allocator peaks (max_memory_allocated, max_memory_reserved), NVML peak and growth."""
    out = []
    for g in row.get("gpus") or []:
        before, peak = g.get("nvml_used_before"), g.get("nvml_used_peak")
        out.append(
            {
                "index": g.get("index"),
                "allocated": g.get("max_memory_allocated"),
                "reserved": g.get("max_memory_reserved"),
                "nvml_peak": peak,
                "nvml_added": peak - before if peak is not None and before is not None else None,
            }
        )
    return out


def peak_per_gpu(row: dict[str, Any]) -> float | None:
    """The peak memory one GPU needed: the row's peak on one device, the largest rank's on several."""
    if world_size(row) > 1:
        peaks = [g["allocated"] for g in gpu_memory(row) if g["allocated"] is not None]
        if peaks:
            return max(peaks)
    return row.get("peak_bytes")


def tokens(row: dict[str, Any]) -> int:
    return int(row.get("batch") or 1) * int(row["seq_len"])


def value_text(v: Any) -> str:
    """A parameter's value: lists as '1024,2048'."""
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def config_text(config: dict[str, Any] | None, sep: str = ", ") -> str:
    return sep.join(f"{k}={value_text(v)}" for k, v in (config or {}).items() if k != "max_chunk_tokens")


def describe(row: dict[str, Any]) -> str:
    """What a series is, for a table cell: its label (implementation and parameters)."""
    return row.get("label") or compact_label({**row, "label": f"{row.get('impl')}()"})


# A label the runner derived from the configuration, `impl(k=v, ...)` and ` xP` on P ranks;
# a profile's own label is kept as written.
_AUTO_LABEL = re.compile(r"^(?P<impl>[\w.-]+)(\((?P<args>.*)\))?(?P<ranks> x\d+)?$")
_SHOWN_COMPACTLY = {"segment_lengths", "dilation_rates", "pattern_type", "sparsity_ratio", "block_size"}


def short_name(row: dict[str, Any]) -> str:
    """An implementation and its configuration in a few characters: `dilated[2048,4096/1,2]`,
    `bs:local_window 5%/128` (block-sparse keeping 5% of blocks of 128 tokens)."""
    cfg = row.get("config") or {}
    impl = str(row.get("impl"))
    name = impl
    if impl.startswith("block-sparse"):
        kept = f"{float(cfg.get('sparsity_ratio') or 0) * 100:g}%"
        prefix = "bs" + impl[len("block-sparse") :]
        name = f"{prefix}:{cfg.get('pattern_type', '?')} {kept}/{cfg.get('block_size', '?')}"
    if cfg.get("segment_lengths"):
        name += f"[{','.join(map(str, cfg['segment_lengths']))}/{','.join(map(str, cfg.get('dilation_rates') or []))}]"
    return name


def compact_label(row: dict[str, Any]) -> str:
    """The row's label with a derived `impl(k=v, ...)` part written as ``short_name``; other
    non-default parameters stay, as `(k=v)`."""
    label = str(row.get("label") or "")
    m = _AUTO_LABEL.match(label)
    if not m or m["impl"] != row.get("impl"):
        return label
    rest = [
        a
        for a in re.split(r", (?=\w+=)", m["args"] or "")
        if a and a.split("=")[0] not in _SHOWN_COMPACTLY and a != "backend=auto"
    ]
    return short_name(row) + (f"({', '.join(rest)})" if rest else "") + (m["ranks"] or "")


def settings_key(row: dict[str, Any]) -> tuple:
    """Everything that must match for two rows to be compared, apart from the implementation."""
    return tuple(row.get(k) for k in ("dtype", "batch", "heads", "head_dim", "mode", "causal", "device"))


def settings_text(row: dict[str, Any]) -> str:
    return (
        f"{row.get('dtype')}, B={row.get('batch')}, H={row.get('heads')}, D={row.get('head_dim')}, "
        f"{row.get('mode')}{', causal' if row.get('causal') else ''}, {row.get('device')}"
    )


def config_id(config: dict[str, Any] | None) -> str:
    return json.dumps(config or {}, sort_keys=True, default=str)


def configs_agree(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Same configuration on every parameter both have (a ring variant adds its own)."""
    a, b = a or {}, b or {}
    return all(a[k] == b[k] for k in set(a) & set(b))
