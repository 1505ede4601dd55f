"""The seed reports' claims (``seed_claims.toml``) and what the rows of one machine measure of each.

A claim names one quantity (``metric``) and the rows that measure it (``match``), or the ratio
of two quantities (``match`` over ``over``). ``measure`` gives the quantity on one machine with
its 95% interval and n, from the newest matching row (``pick = "best"``: the largest over the
matching rows, for a claim about the best case). Whether that confirms the seed is
``report.verdicts``'s rule, written out in docs/verdicts.md.
"""

from __future__ import annotations

import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.report import data as d
from attnbench.report.fit import GIB, MemoryFit, fit_memory, fit_miss_cause
from attnbench.report.intervals import time_interval
from attnbench.schema import Row, Speedup
from attnbench.units import format_tokens

CLAIMS_FILE = Path(__file__).with_name("seed_claims.toml")
METRICS = (
    "speedup",  # single-GPU time / multi-GPU time of a speedup case
    "efficiency",  # speedup / GPUs
    "time_ms",
    "tokens_per_s",
    "peak_bytes",  # the trial's peak (allocator on a GPU, resident-set growth on a CPU)
    "peak_per_gpu",  # the fullest GPU's (or rank's) peak
    "inputs_bytes",  # q, k, v as allocated
    "added_bytes",  # peak minus q, k, v: what the call itself allocated (output, workspace)
    "added_per_token",  # added_bytes over the tokens
    "bytes_per_token",  # peak per GPU over the tokens that GPU holds
    "gpu0_bytes",  # allocator peak of GPU 0 (GPU 1) in a multi-GPU row
    "gpu1_bytes",
    "max_seq",  # the longest length a max-seq search ran
    "max_seq_8gb",  # the longest length in 8 GiB: measured under that limit, else solved from a fit
)
HARDWARE_BOUND = ("time_ms", "tokens_per_s")  # the speed of one device: never compared across devices
BYTES = ("peak_bytes", "peak_per_gpu", "inputs_bytes", "added_bytes", "gpu0_bytes", "gpu1_bytes")
TOKENS = ("max_seq", "max_seq_8gb")
UNIT_SCALE = {"GB": 1e9, "MB": 1e6, "KB": 1e3, "%": 0.01}  # seed units to the rows' (bytes, ratios); others as is
ROW_KEYS = (
    "kind",
    "impl",
    "strategy",
    "seq_len",
    "batch",
    "world_size",
    "dtype",
    "heads",
    "head_dim",
    "mode",
    "device",
    "memory_limit",
)
SETTLES = ("one GPU", "two GPUs", "CPU")
EIGHT_GIB = 8 * GIB  # the seeds' GTX 1080


@dataclass
class Claim:
    id: str
    seed: str
    says: str
    value: float
    unit: str
    workload: str
    gpus: int
    metric: str
    match: dict[str, Any] = field(default_factory=dict)
    over: dict[str, Any] | None = None
    per: float | None = None  # the seed's number is value / per (65,536 tokens of 237,568: 0.28)
    range: list[float] | None = None  # [low, high] where the seed gives a range
    scale: float | None = None  # the measured quantity times this (the note says why)
    printed: str | None = None  # the seed's number as printed, where a trailing zero sets its rounding
    direction: str | None = None  # "above:X" or "below:X": the side of X the claim also states
    comparable: bool = True
    note: str = ""  # why it is not comparable, or how the rows stand in for the seed's workload
    pick: str = "newest"  # or "best": the largest value of the matching rows
    settles: str | None = None  # where rows that measure it come from: one GPU, two GPUs, CPU

    @property
    def _to_rows(self) -> float:
        """Seed units to the rows' (bytes, tokens, ms, a ratio), divided by ``per``."""
        return UNIT_SCALE.get(self.unit.split(" ")[0], 1.0) / (self.per or 1.0)

    @property
    def seed_value(self) -> float:
        """The seed's number in the rows' units."""
        return self.value * self._to_rows

    @property
    def seed_range(self) -> tuple[float, float]:
        """Every value the seed's number stands for, in the rows' units: its range where it gives
        one, else what rounds to it (half the unit of its last printed digit either side)."""
        if self.range:
            return self.range[0] * self._to_rows, self.range[1] * self._to_rows
        text = self.printed or repr(self.value)
        decimals = len(text.split(".")[1]) if "." in text else 0
        half = 10.0**-decimals / 2 * self._to_rows
        return self.seed_value - half, self.seed_value + half

    @property
    def seed_text(self) -> str:
        def num(v: float) -> str:
            return f"{int(v):,}" if float(v).is_integer() and abs(v) >= 1000 else f"{v:g}"

        shown = f"{num(self.range[0])}-{num(self.range[1])}" if self.range else self.printed or num(self.value)
        space = "" if self.unit[:1] in ("x", "%") else " "
        return f"{shown}{space}{self.unit}" + (f" (of {num(self.per)})" if self.per else "")

    @property
    def where(self) -> str:
        """Where rows that measure it can come from."""
        if self.settles:
            return self.settles
        wide = self.gpus > 1 or any(int(m.get("world_size") or 1) > 1 for m in (self.match, self.over or {}))
        return "two GPUs" if wide else "one GPU"


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise AttnbenchError(f"cannot read seed claims {path}: {e}: fix or restore the file") from None
    claims, seen = [], set()
    for entry in raw.get("claim", []):
        try:
            c = Claim(**entry)
        except TypeError as e:
            raise AttnbenchError(f"{path}: claim {entry.get('id', '?')}: {e}") from None
        side, _, threshold = (c.direction or "above:0").partition(":")
        if (
            c.metric not in METRICS
            or side not in ("above", "below")
            or not _number(threshold)
            or c.pick not in ("newest", "best")
            or (c.settles is not None and c.settles not in SETTLES)
            or c.id in seen
        ):
            raise AttnbenchError(
                f"{path}: claim {c.id}: metric must be one of {', '.join(METRICS)}, direction above:X or "
                f"below:X, pick newest or best, settles one of {', '.join(SETTLES)}, ids unique"
            )
        if c.comparable and not c.match:
            raise AttnbenchError(f"{path}: claim {c.id}: a comparable claim needs a match")
        if not c.comparable and not c.note:
            raise AttnbenchError(f"{path}: claim {c.id}: a claim that is not comparable says why in its note")
        seen.add(c.id)
        claims.append(c)
    return claims


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --- rows that measure a claim ----------------------------------------------------------------------


def matches(row: Row, match: dict[str, Any]) -> bool:
    """Every key of ``match`` agrees with the row (a row field, else a configuration
    parameter); a list for a row field means any of its values."""
    ident = row.identity() if hasattr(row, "identity") else {}
    config = getattr(row, "config", None) or {}
    for key, want in match.items():
        if key in ROW_KEYS:
            have = row.kind if key == "kind" else ident.get(key, getattr(row, key, None))
            if have not in (want if isinstance(want, list) else [want]):
                return False
        elif config.get(key) != want:
            return False
    return True


@dataclass
class Measured:
    value: float
    low: float | None
    high: float | None
    n: str
    machine: str
    workload: str
    date: str
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # FILE:LINE of the rows behind it

    def scaled(self, by: float) -> Measured:
        low, high = (self.low * by, self.high * by) if self.low is not None and self.high is not None else (None, None)
        return Measured(
            self.value * by, low, high, self.n, self.machine, self.workload, self.date, self.notes, self.sources
        )


def _chosen(rows: list[Any], value, pick: str) -> tuple[Any, int]:
    """The newest row (or the one of largest value) and how many others matched."""
    if not rows:
        return None, 0
    if pick == "best":
        return max(rows, key=lambda r: (value(r), d.row_date(_row(r)))), len(rows) - 1
    return max(rows, key=lambda r: d.row_date(_row(r))), len(rows) - 1


def _row(item: Any) -> Row:
    return item["row"] if isinstance(item, dict) else item


def _speedup(m, match, pick: str, per_gpu: bool) -> Measured | None:
    cases = [c for c in m.speedups if c["speedup"] and matches(c["row"], match)]
    if pick == "best":  # an efficiency above 1 beyond its interval is an anomaly, never the best case
        cases = [c for c in cases if not (c["efficiency_ci"] and c["efficiency_ci"].low > 1)]
    c, others = _chosen(cases, lambda c: c["efficiency" if per_gpu else "speedup"], pick)
    if c is None:
        return None
    iv = c["efficiency_ci"] if per_gpu else c["speedup_ci"]
    row = c["row"]
    out = Measured(
        iv.value,
        iv.low if iv.n > 1 else None,
        iv.high if iv.n > 1 else None,
        f"{_n(c['single'])}/{_n(row)}",
        m.name,
        short_label(row),
        d.row_date(row),
        sources=[x.source for x in (c["single"], row) if x is not None and x.source],
    )
    out.notes += replica_notes(row)
    if c["efficiency_ci"] and c["efficiency_ci"].low > 1:
        out.notes.append(f"efficiency {c['efficiency']:.2f} is above 1: unequal work, not super-linear scaling")
    if others:
        out.notes.append(f"the {'best' if pick == 'best' else 'newest'} of {others + 1} matching cases")
    return out


def _n(row: Row | None) -> int:
    iv = time_interval(row) if row is not None else None
    return iv.n if iv else 1


def _row_value(metric: str, row: Row) -> float | None:
    get = lambda name: getattr(row, name, None)  # noqa: E731 (a speedup row lacks some trial fields)
    if metric == "time_ms":
        return get("time_ms")
    if metric == "tokens_per_s":
        return get("tokens_per_s") or (d.tokens(row) / (row.time_ms / 1e3) if get("time_ms") else None)
    if metric == "peak_per_gpu":
        return d.peak_per_gpu(row)
    if metric in ("added_bytes", "added_per_token"):
        peak, inputs = get("peak_bytes"), get("inputs_bytes")
        if peak is None or inputs is None:
            return None
        return (peak - inputs) / (d.tokens(row) if metric == "added_per_token" else 1)
    if metric == "bytes_per_token":
        peak = d.peak_per_gpu(row)
        return peak / (d.tokens(row) / d.world_size(row)) if peak else None
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        gpus = d.gpu_memory(row)
        i = int(metric[3])
        return gpus[i]["allocated"] if len(gpus) > i else None
    return get(metric)


def _row_metric(m, metric: str, match: dict[str, Any], pick: str) -> Measured | None:
    pool = d.trials(m.rows) + d.speedup_rows(m.rows)
    rows = [r for r in d.ok(pool) if matches(r, match) and _row_value(metric, r) is not None]
    row, others = _chosen(rows, lambda r: _row_value(metric, r), pick)
    if row is None:
        return None
    value = _row_value(metric, row)
    low = high = None
    iv = time_interval(row)
    timed = metric in HARDWARE_BOUND and iv is not None and iv.n > 1
    if timed and metric == "time_ms":
        low, high = iv.low, iv.high
    elif timed:  # a rate: the bounds swap
        low, high = value * row.time_ms / iv.high, value * row.time_ms / iv.low
    out = Measured(
        value, low, high, str(iv.n if timed else 1), m.name, short_label(row), d.row_date(row), sources=[row.source]
    )
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        out.notes += replica_notes(row)
    if others and pick == "newest":
        out.notes.append(f"the newest of {others + 1} matching rows")
    return out


def _max_seq(m, match: dict[str, Any]) -> Measured | None:
    found = [s for s in m.summaries if s["max_seq_len"] and matches(s["head"], match)]
    if not found:
        return None
    s = max(found, key=lambda s: d.row_date(s["head"]))
    bound = "" if s["complete"] else "at least "
    return Measured(
        s["max_seq_len"],
        None,
        None,
        "1 search",
        m.name,
        short_label(s["head"]),
        d.row_date(s["head"]),
        [f"{bound}what one search ran, stopped by {s['stopped_by']}"],
        [s["head"].source],
    )


def _max_seq_8gb(m, match: dict[str, Any]) -> Measured | None:
    """The longest sequence in 8 GiB: a finished search under an 8 GiB allocator limit where one
    ran, else the series' memory fit solved for 8 GiB (the allocator's share, with what this
    device sets aside for the CUDA context)."""
    limited = [
        s
        for s in m.summaries
        if s["max_seq_len"] and s["complete"] and s["head"].memory_limit == EIGHT_GIB and matches(s["head"], match)
    ]
    if limited:
        s = max(limited, key=lambda s: d.row_date(s["head"]))
        return Measured(
            s["max_seq_len"],
            None,
            None,
            "1 search",
            m.name,
            short_label(s["head"]),
            d.row_date(s["head"]),
            [f"a search under an 8 GiB allocator limit, stopped by {s['stopped_by']}"],
            [s["head"].source],
        )
    if match.get("kind") == "speedup":
        return _speedup_capacity(m, match)
    found = [c for c in m.capacities if c.fit and matches(c.head, match) and c.predict_for(EIGHT_GIB)]
    if not found:
        return None
    c = max(found, key=lambda c: (c.successful, d.row_date(c.head)))
    notes = [f"the {'quadratic' if c.fit.degree == 2 else 'linear'} fit of {c.successful} trials solved for 8 GiB"]
    if c.error is not None and abs(c.error) > 0.05:
        notes.append(f"it misses this GPU's measured maximum by {c.error * 100:+.0f}% ({fit_miss_cause(c)})")
    return Measured(
        c.predict_for(EIGHT_GIB),
        None,
        None,
        f"{c.successful} trials",
        m.name,
        short_label(c.head),
        d.row_date(c.head),
        notes,
        [c.head.source],
    )


def _speedup_capacity(m, match: dict[str, Any]) -> Measured | None:
    """8 GiB capacity from speedup rows: GPU 0's allocator peak fitted over the cases' lengths
    (batch-1 DataParallel holds everything on GPU 0)."""
    rows = [r for r in d.ok(d.speedup_rows(m.rows)) if matches(r, match) and _gpu0_reserved(r)]
    if len({r.seq_len for r in rows}) < 2:
        return None
    fit: MemoryFit | None = fit_memory([r.seq_len for r in rows], [_gpu0_reserved(r) for r in rows], 1)
    aside = [
        g["nvml_peak"] - g["reserved"] for r in rows for g in d.gpu_memory(r)[:1] if g["nvml_peak"] and g["reserved"]
    ]
    n = fit.max_seq(EIGHT_GIB - (statistics.median(aside) if aside else 0.0)) if fit else None
    if n is None:
        return None
    newest = max(rows, key=d.row_date)
    return Measured(
        n,
        None,
        None,
        f"{len(rows)} rows",
        m.name,
        short_label(newest),
        d.row_date(newest),
        [f"a linear fit of GPU 0's reserved peak at {len({r.seq_len for r in rows})} lengths solved for 8 GiB"],
        [r.source for r in rows],
    )


def _gpu0_reserved(row: Speedup) -> float | None:
    gpus = d.gpu_memory(row)
    return (gpus[0]["reserved"] or gpus[0]["allocated"]) if gpus else None


def measure_one(claim: Claim, m, match: dict[str, Any]) -> Measured | None:
    if claim.metric in ("speedup", "efficiency"):
        return _speedup(m, match, claim.pick, claim.metric == "efficiency")
    if claim.metric == "max_seq":
        return _max_seq(m, match)
    if claim.metric == "max_seq_8gb":
        return _max_seq_8gb(m, match)
    return _row_metric(m, claim.metric, match, claim.pick)


def measure(claim: Claim, m) -> Measured | None:
    """The claim's quantity on one machine: its metric, or the ratio ``match`` over ``over``,
    times ``scale``. A claim about GPUs takes GPU rows only, unless its rows come from the CPU
    (``settles = "CPU"``): a CPU's memory fit says nothing certain about a GPU's."""
    on = {} if claim.where == "CPU" else {"device": "cuda"}
    top = measure_one(claim, m, {**on, **claim.match})
    if top is None or claim.over is None:
        return top.scaled(claim.scale) if top is not None and claim.scale else top
    over = {**on, **claim.over}
    if "seq_len" in claim.match and "seq_len" not in over:
        over["seq_len"] = claim.match["seq_len"]
    bottom = measure_one(claim, m, over)
    if bottom is None or not bottom.value:
        return None
    low = high = None
    if None not in (top.low, top.high, bottom.low, bottom.high) and bottom.low and bottom.high:
        low, high = top.low / bottom.high, top.high / bottom.low
    ratio = Measured(
        top.value / bottom.value,
        low,
        high,
        f"{top.n}/{bottom.n}",
        m.name,
        f"{top.workload} over {bottom.workload}",
        max(top.date, bottom.date),
        top.notes + [n for n in bottom.notes if n not in top.notes],
        top.sources + bottom.sources,
    )
    return ratio.scaled(claim.scale) if claim.scale else ratio


def replica_notes(row: Row) -> list[str]:
    """Why a data-parallel GPU sat idle: fewer batch elements than GPUs."""
    batch = int(getattr(row, "batch", 1) or 1)
    if getattr(row, "strategy", None) == "dp" and batch < d.world_size(row):
        idle = ", ".join(f"GPU {i}" for i in range(batch, d.world_size(row)))
        return [f"at batch {batch} DataParallel ran {batch} replica; {idle} held nothing"]
    return []


# --- labels -----------------------------------------------------------------------------------------


def short_label(row: Row) -> str:
    """A series with its settings in a few characters (LEGEND explains the notation)."""
    p = d.world_size(row)
    strategy = getattr(row, "strategy", None)
    how = f" {strategy}" if strategy and strategy not in ("single", "ring") else ""
    return f"{d.short_name(row)} {row.dtype} B{row.batch or 1} H{row.heads} D{row.head_dim} {row.mode or 'fwd'}" + (
        f" x{p}{how}" if p > 1 or how else ""
    )


LEGEND = (
    "Workloads: `impl[segment lengths/dilation rates]`; `bs:PATTERN S%/BLOCK` is block-sparse keeping S% of "
    "blocks of BLOCK tokens; then dtype, B batch, H heads, D head dim, mode (fwd, fwd_bwd), xP on P GPUs "
    "(or CPU processes), with the strategy (dp DataParallel, mp one process per GPU)."
)


def value_text(metric: str, v: float) -> str:
    if metric in BYTES:
        return f"{v / 1e6:,.3g} MB" if abs(v) < 1e8 else f"{v / 1e9:.3g} GB"
    if metric in ("bytes_per_token", "added_per_token"):
        return f"{v / 1e3:.3g} KB/token"
    if metric in TOKENS:
        return format_tokens(int(v))
    if metric == "time_ms":
        return f"{v:,.3g} ms"
    if metric == "tokens_per_s":
        return f"{v:,.0f} tok/s" if v >= 1000 else f"{v:.3g} tok/s"
    if metric == "efficiency":
        return f"{v * 100:.3g}%"
    return f"{v:.3g}x"
