"""Result rows as a report sees them: typed rows from ``attnbench.results.load_rows``, grouped
by the machine that measured them (never merged across machines), with short labels, a series
measured under several memory limits or by several versions of the code split apart, and the
few derived quantities every section needs."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.results import load_rows
from attnbench.results.read import Keep, distinct_paths, files_of, paths_text
from attnbench.results.schema import Row, Speedup, Trial, Verify, Workload
from attnbench.results.series import (
    Retired,
    has_label,
    machine_of,
    read_superseded,
    relabel,
    retire,
    separate_code_versions,
    separate_memory_limits,
)


@dataclass
class Results:
    sources: tuple[Path, ...]  # the results paths read, as given
    files: list[Path]
    rows: list[Row]
    problems: list[str]  # one line per unreadable line: FILE:LINE: why
    by_machine: dict[str, list[Row]] = field(default_factory=dict)
    retired: list[Retired] = field(default_factory=list)

    @property
    def source(self) -> str:
        return paths_text(self.sources)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def load(
    paths: Path | Sequence[Path], loaded: tuple[list[Row], list[str]] | None = None, keep: Keep | None = None
) -> Results:
    """Every readable row under the results paths (directories or trials.jsonl files;
    ``loaded``: what ``load_rows`` read of them already; ``keep``: the rows a reader needs,
    none of them an answer that the paths hold nothing); bad input (a path with nothing to
    read) is a one-line error."""
    sources = distinct_paths(paths)
    files = files_of(
        sources,
        lambda path: f"no trials.jsonl under {path}: run e.g. `attnbench run --profile auto --out {path}` first",
    )
    rows, problems = loaded or load_rows(files, keep)
    if not rows and keep is None:
        raise AttnbenchError(
            f"{paths_text(sources)} holds no readable result rows ({len(problems)} unreadable lines in "
            f"{len(files)} files): run `attnbench run --profile auto --out DIR` and report on DIR"
        )
    superseded = {run: why for path in sources if path.is_dir() for run, why in read_superseded(path).items()}
    rows, retired = retire(rows, superseded)
    rows = [relabel(r, marked(r) + compact_label(r)) if has_label(r) else r for r in rows]
    rows = separate_code_versions(separate_memory_limits(rows))
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(machine_of(r), []).append(r)
    return Results(sources, files, rows, problems, groups, retired)


# A label's mark where the row ran without the reference check first (every table shows it).
UNVERIFIED = "[unverified] "


def marked(row: Row) -> str:
    """``UNVERIFIED`` for a row run without the reference check first, else nothing."""
    return UNVERIFIED if getattr(row, "verified", None) is False else ""


# --- kinds and fields -------------------------------------------------------------------------


def trials(rows: list[Row]) -> list[Trial]:
    return [r for r in rows if isinstance(r, Trial)]


def speedup_rows(rows: list[Row]) -> list[Speedup]:
    return [r for r in rows if isinstance(r, Speedup)]


def verifications(rows: list[Row]) -> list[Verify]:
    return [r for r in rows if isinstance(r, Verify)]


def ok(rows: list[Any]) -> list[Any]:
    return [r for r in rows if getattr(r, "status", None) == "ok"]


def world_size(row: Workload | None) -> int:
    return int((row.world_size if row is not None else None) or 1)


def gpus(row: Row | None) -> list:
    """Per GPU of a multi-GPU row: its allocator peaks and NVML peak (``schema.GpuMemory``)."""
    return getattr(row, "gpus", None) or []


def peak_per_gpu(row: Row | None) -> float | None:
    """The peak memory one GPU needed: the row's peak on one device, the largest rank's on several."""
    if row is None:
        return None
    if world_size(row) > 1:
        peaks = [g.max_memory_allocated for g in gpus(row) if g.max_memory_allocated is not None]
        if peaks:
            return max(peaks)
    return getattr(row, "peak_bytes", None)


def tokens(row: Workload) -> int:
    return int(row.batch or 1) * int(row.seq_len)


# --- names --------------------------------------------------------------------------------------


def _get(row: Any, name: str) -> Any:
    """A field of a typed row or of a plain row dict (the regression check reads dicts)."""
    return row.get(name) if isinstance(row, dict) else getattr(row, name, None)


def value_text(v: Any) -> str:
    """A parameter's value: lists as '1024,2048'."""
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def config_text(config: dict[str, Any] | None, sep: str = ", ") -> str:
    return sep.join(f"{k}={value_text(v)}" for k, v in (config or {}).items() if k != "max_chunk_tokens")


def describe(row: Any) -> str:
    """What a series is, for a table cell: its label (implementation and parameters)."""
    return _get(row, "label") or compact_label(row, f"{_get(row, 'impl')}()")


# A label the runner derived from the configuration, `impl(k=v, ...)`, ` xP` on P ranks and
# ` for MODEL` with a model preset; a profile's own label is kept as written.
_AUTO_LABEL = re.compile(r"^(?P<impl>[\w.-]+)(\((?P<args>.*)\))?(?P<ranks> x\d+)?(?P<model> for [\w.-]+)?$")
# what ``short_name`` appends to any implementation's name that has them
SEGMENTS = ("segment_lengths", "dilation_rates")


def heads_text(row: Any) -> str:
    """Query heads, and the key/value heads they share where fewer: `H8`, `H32/8`."""
    kv = getattr(row, "kv_heads", None)
    return f"H{row.heads}" + (f"/{kv}" if kv and kv != row.heads else "")


def short_name(row: Any) -> str:
    """An implementation and its configuration in a few characters: the name its spec gives
    (``impls.short_name``: `bs:local_window 5%/128` is block-sparse keeping 5% of blocks of 128
    tokens), its segment lengths and dilation rates after it (`dilated[2048,4096/1,2]`)."""
    cfg = _get(row, "config") or {}
    name = impls.short_name(str(_get(row, "impl")), cfg)
    if cfg.get("segment_lengths"):
        name += f"[{','.join(map(str, cfg['segment_lengths']))}/{','.join(map(str, cfg.get('dilation_rates') or []))}]"
    return name


def compact_label(row: Any, label: str | None = None) -> str:
    """The row's label with a derived `impl(k=v, ...)` part written as ``short_name``; other
    non-default parameters stay, as `(k=v)`."""
    label = str(label if label is not None else _get(row, "label") or "")
    m = _AUTO_LABEL.match(label)
    if not m or m["impl"] != _get(row, "impl"):
        return label
    rest = [
        a
        for a in re.split(r", (?=\w+=)", m["args"] or "")
        if a and a.split("=")[0] not in (*SEGMENTS, *impls.shown(m["impl"])) and a != "backend=auto"
    ]
    return short_name(row) + (f"({', '.join(rest)})" if rest else "") + (m["ranks"] or "") + (m["model"] or "")


# --- matching -------------------------------------------------------------------------------------


def settings_key(row: Workload) -> str:
    """Everything that must match for two rows to be compared, apart from the implementation
    and its configuration: the workload's identity without those and its length."""
    return row.identity_key(seq_len=False, without=("impl", "config", "world_size", "strategy"))


def settings_text(row: Workload) -> str:
    return (
        f"{row.dtype}, B={row.batch}, H={row.heads}, D={row.head_dim}, "
        f"{row.mode}{', causal' if row.causal else ''}, {row.device}"
    )


def config_id(config: dict[str, Any] | None) -> str:
    return json.dumps(config or {}, sort_keys=True, default=str)


def configs_agree(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Same configuration on every parameter both have (a ring variant adds its own)."""
    a, b = a or {}, b or {}
    return all(a[k] == b[k] for k in set(a) & set(b))
