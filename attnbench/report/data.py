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

UNKNOWN_MACHINE = "unknown machine"


@dataclass
class Results:
    source: Path
    files: list[Path]
    rows: list[dict[str, Any]]
    problems: list[str]                     # one line per unreadable line: FILE:LINE: why
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
        raise AttnbenchError(f"no trials.jsonl under {path}: run e.g. `attnbench run --profile auto --out {path}` first")
    rows, problems = read_rows(path)
    if not rows:
        raise AttnbenchError(f"{path} holds no readable result rows ({len(problems)} unreadable lines in "
                             f"{len(files)} files): run `attnbench run --profile auto --out DIR` and report on DIR")
    rows = separate_code_versions(rows)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(machine_of(r), []).append(r)
    return Results(path, files, rows, problems, groups)


def short_commit(row: dict[str, Any]) -> str:
    commit = str((row.get("env") or {}).get("commit") or "unknown")
    head, _, dirty = commit.partition("-")
    return head[:9] + (f"-{dirty}" if dirty else "")


def separate_code_versions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A series measured by several versions of the code is several series: trials of
    different code never pool into one search, one table or one fit (a before-and-after
    pair in one results tree stays a pair). Rows of such a series get the commit in their
    series key and label; series measured by one commit keep theirs."""
    commits: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        if r.get("series"):
            commits.setdefault((machine_of(r), r["series"]), set()).add(short_commit(r))
    split = {key for key, seen in commits.items() if len(seen) > 1}
    if not split:
        return rows
    return [{**r, "series": f"{r['series']}@{short_commit(r)}",
             "label": f"{r.get('label') or r.get('impl')} @ {short_commit(r)}"}
            if (machine_of(r), r.get("series")) in split else r for r in rows]


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
        out.append({"index": g.get("index"), "allocated": g.get("max_memory_allocated"),
                    "reserved": g.get("max_memory_reserved"),
                    "nvml_peak": peak, "nvml_added": peak - before if peak is not None and before is not None else None})
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
    """What a series is, for a table cell: its label, else the implementation and its parameters."""
    config = config_text(row.get("config"))
    return row.get("label") or (f"{row.get('impl')}({config})" if config else str(row.get("impl")))


def settings_key(row: dict[str, Any]) -> tuple:
    """Everything that must match for two rows to be compared, apart from the implementation."""
    return tuple(row.get(k) for k in ("dtype", "batch", "heads", "head_dim", "mode", "causal", "device"))


def settings_text(row: dict[str, Any]) -> str:
    return (f"{row.get('dtype')}, B={row.get('batch')}, H={row.get('heads')}, D={row.get('head_dim')}, "
            f"{row.get('mode')}{', causal' if row.get('causal') else ''}, {row.get('device')}")


def config_id(config: dict[str, Any] | None) -> str:
    return json.dumps(config or {}, sort_keys=True, default=str)


def configs_agree(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Same configuration on every parameter both have (a ring variant adds its own)."""
    a, b = a or {}, b or {}
    return all(a[k] == b[k] for k in set(a) & set(b))
