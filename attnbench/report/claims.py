"""The seed reports' claims (``seed_claims.toml``) confronted with the rows that measure them.

Each claim names a metric and a matcher; on each machine the newest matching row (or the ratio
of two, ``match`` over ``over``) gives the measured value, its spread and n. The verdict follows
from the claim's test: ``near:TOL``, ``above:X``, ``below:X`` or ``none``. Absolute speed
(time, tokens/s) belongs to the GPU that ran it, so it is never compared across hardware.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.report import data as d
from attnbench.report.fit import GIB, fit_miss_cause
from attnbench.report.intervals import time_interval
from attnbench.units import format_tokens

CLAIMS_FILE = Path(__file__).with_name("seed_claims.toml")
METRICS = (
    "speedup",
    "time_ms",
    "tokens_per_s",
    "peak_bytes",
    "peak_per_gpu",
    "inputs_bytes",
    "gpu0_bytes",
    "gpu1_bytes",
    "max_seq",
    "max_seq_8gb",
)
HARDWARE_BOUND = ("time_ms", "tokens_per_s")  # speed of one GPU: not comparable with a GTX 1080's
BYTES = ("peak_bytes", "peak_per_gpu", "inputs_bytes", "gpu0_bytes", "gpu1_bytes")
UNIT_SCALE = {"GB": 1e9, "MB": 1e6}  # seed units to the rows' units (bytes); others as is
ROW_KEYS = ("kind", "impl", "strategy", "seq_len", "batch", "world_size", "dtype", "heads", "head_dim", "mode")
CONFIRMED, REFUTED, NOT_COMPARABLE, NOT_MEASURED = "confirmed", "refuted", "not comparable", "not measured yet"
SEEDS_COMMAND = "attnbench run --profile seeds"


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
    test: str
    match: dict[str, Any] = field(default_factory=dict)
    over: dict[str, Any] | None = None
    per: float | None = None
    note: str = ""

    @property
    def seed_value(self) -> float:
        """The seed's number in the rows' units (bytes, tokens, ms), divided by ``per``."""
        return self.value * UNIT_SCALE.get(self.unit, 1.0) / (self.per or 1.0)

    @property
    def seed_text(self) -> str:
        def num(v: float) -> str:
            return f"{int(v):,}" if float(v).is_integer() and abs(v) >= 1000 else f"{v:g}"

        return f"{num(self.value)} {self.unit}" + (f" (of {num(self.per)})" if self.per else "")


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
        kind, _, _ = c.test.partition(":")
        if c.metric not in METRICS or kind not in ("near", "above", "below", "none") or c.id in seen:
            raise AttnbenchError(
                f"{path}: claim {c.id}: metric must be one of {', '.join(METRICS)}, test "
                "near:TOL|above:X|below:X|none, ids unique"
            )
        if kind != "none" and not c.match:
            raise AttnbenchError(f"{path}: claim {c.id}: a test other than none needs a match")
        seen.add(c.id)
        claims.append(c)
    return claims


# --- rows that measure a claim ----------------------------------------------------------------------


def matches(row: dict[str, Any], match: dict[str, Any]) -> bool:
    """Every key of ``match`` agrees with the row (row field, else configuration parameter);
    a list of strings for a row field means any of them."""
    config = row.get("config") or {}
    for key, want in match.items():
        have = (d.world_size(row) if key == "world_size" else row.get(key)) if key in ROW_KEYS else config.get(key)
        if key in ROW_KEYS and isinstance(want, list):
            if have not in want:
                return False
        elif have != want:
            return False
    return True


def spread(row: dict[str, Any]) -> tuple[float | None, float | None, int]:
    """(low, high, n): the 95% bootstrap interval of a row's median time, the uncertainty shown
    beside every time-derived number (computed from the samples where a row predates intervals)."""
    iv = time_interval(row) if row else None
    if iv is None:
        return None, None, len(row.get("times_ms") or []) or 1
    return iv.low, iv.high, iv.n


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


def _newest(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, int]:
    """The newest row and how many older ones it supersedes."""
    if not rows:
        return None, 0
    rows = sorted(rows, key=d.row_date)
    return rows[-1], len(rows) - 1


def _speedup(m, match) -> Measured | None:
    cases = [c for c in m.speedups if c["speedup"] and matches(c["row"], match)]
    newest, older = _newest([c["row"] for c in cases])
    if newest is None:
        return None
    c = next(c for c in cases if c["row"] is newest)
    low, high, n = speedup_interval(c)
    out = Measured(c["speedup"], low, high, n, m.name, short_label(newest), d.row_date(newest))
    out.notes += replica_notes(newest) + speedup_anomalies(c)[1:]  # "interval includes 1" is the verdict's
    if older:
        out.notes.append(f"supersedes {older} older row{'s' * (older > 1)}")
    return out


def speedup_interval(c: dict[str, Any]) -> tuple[float | None, float | None, str]:
    """(low, high, n) of a speedup case: the bootstrap interval of the ratio of the two medians."""
    _, _, ns = spread(c["single"] or {})
    _, _, nm = spread(c["row"])
    iv = c.get("speedup_ci")
    if iv is None:
        return None, None, f"{ns}/{nm}"
    return iv.low, iv.high, f"{ns}/{nm}"


def speedup_anomalies(c: dict[str, Any]) -> list[str]:
    """[interval note or "", efficiency note...]: what makes a speedup suspect."""
    low, high, _ = speedup_interval(c)
    out = ["anomaly: interval includes 1" if low is not None and low <= 1 <= high else ""]
    if c["efficiency"] and c["efficiency"] > 1:
        out.append(f"anomaly: efficiency {c['efficiency']:.2f} above 1")
    return out


def _row_value(metric: str, row: dict[str, Any]) -> float | None:
    if metric == "time_ms":
        return row.get("time_ms")
    if metric == "tokens_per_s":
        return row.get("tokens_per_s") or (d.tokens(row) / (row["time_ms"] / 1e3) if row.get("time_ms") else None)
    if metric == "peak_per_gpu":
        return d.peak_per_gpu(row)
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        gpus = d.gpu_memory(row)
        i = int(metric[3])
        return gpus[i]["allocated"] if len(gpus) > i else None
    return row.get(metric)


def _row_metric(m, metric, match) -> Measured | None:
    rows = [
        r
        for r in d.ok(d.trials(m.rows) + [c["row"] for c in m.speedups] + _singles(m))
        if matches(r, match) and _row_value(metric, r) is not None
    ]
    row, older = _newest(rows)
    if row is None:
        return None
    value = _row_value(metric, row)
    low = high = None
    t_low, t_high, n = spread(row)
    if metric == "time_ms":
        low, high = t_low, t_high
    elif metric == "tokens_per_s" and t_low and t_high:  # a rate: the bounds swap
        low, high = value * row["time_ms"] / t_high, value * row["time_ms"] / t_low
    out = Measured(
        value, low, high, str(n if metric in HARDWARE_BOUND else 1), m.name, short_label(row), d.row_date(row)
    )
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        out.notes += replica_notes(row)
    if older:
        out.notes.append(f"supersedes {older} older row{'s' * (older > 1)}")
    return out


def _singles(m) -> list[dict[str, Any]]:
    return [c["single"] for c in m.speedups if c["single"]]


def _max_seq(m, match) -> Measured | None:
    found = [s for s in m.summaries if s["max_seq_len"] and matches(s["head"], match)]
    if not found:
        return None
    s = max(found, key=lambda s: d.row_date(s["head"]))
    return Measured(
        s["max_seq_len"],
        None,
        None,
        "1 search",
        m.name,
        short_label(s["head"]),
        d.row_date(s["head"]),
        [f"stopped by {s['stopped_by']}"],
    )


def _max_seq_8gb(m, match, device_bytes: float) -> Measured | None:
    found = [c for c in m.capacities if c.fit and matches(c.head, match) and c.predict_for(device_bytes)]
    if not found:
        return None
    c = max(found, key=lambda c: (c.successful, d.row_date(c.head)))
    notes = [f"fit of {c.successful} trials solved for {device_bytes / GIB:g} GiB per GPU"]
    if c.measured_max:
        notes.append(f"measured max here {format_tokens(c.measured_max)} ({c.stopped_by})")
    if c.error is not None and abs(c.error) > 0.05:
        notes.append(f"fit misses that maximum by {c.error * 100:+.0f}%: {fit_miss_cause(c)}")
    return Measured(
        c.predict_for(device_bytes),
        None,
        None,
        f"{c.successful} trials",
        m.name,
        short_label(c.head),
        d.row_date(c.head),
        notes,
    )


def measure_one(metric: str, m, match: dict[str, Any], device_bytes: float) -> Measured | None:
    if metric == "speedup":
        return _speedup(m, match)
    if metric == "max_seq":
        return _max_seq(m, match)
    if metric == "max_seq_8gb":
        return _max_seq_8gb(m, match, device_bytes)
    return _row_metric(m, metric, match)


def measure(claim: Claim, m, device_bytes: float = 8 * GIB) -> Measured | None:
    """The claim's quantity on one machine: its metric, or the ratio ``match`` over ``over``."""
    top = measure_one(claim.metric, m, claim.match, device_bytes)
    if top is None or claim.over is None:
        return top
    over = dict(claim.over)
    if "seq_len" in claim.match and "seq_len" not in over:
        over["seq_len"] = claim.match["seq_len"]
    bottom = measure_one(claim.metric, m, over, device_bytes)
    if bottom is None or not bottom.value:
        return None
    low = high = None
    if None not in (top.low, top.high, bottom.low, bottom.high) and bottom.low and bottom.high:
        low, high = top.low / bottom.high, top.high / bottom.low
    return Measured(
        top.value / bottom.value,
        low,
        high,
        f"{top.n}/{bottom.n}",
        m.name,
        f"{top.workload} over {bottom.workload}",
        max(top.date, bottom.date),
        top.notes,
    )


def replica_notes(row: dict[str, Any]) -> list[str]:
    """Why a data-parallel GPU sat idle: fewer batch elements than GPUs."""
    if row.get("strategy") == "dp" and int(row.get("batch") or 1) < d.world_size(row):
        idle = ", ".join(f"GPU {i}" for i in range(int(row.get("batch") or 1), d.world_size(row)))
        return [f"batch {row.get('batch') or 1}: DataParallel ran {row.get('batch') or 1} replica, {idle} idle"]
    return []


# --- labels ---------------------------------------------------------------------------------------


def short_label(row: dict[str, Any]) -> str:
    """A series with its settings in a few characters (LEGEND explains the notation)."""
    p = d.world_size(row)
    return (
        f"{d.short_name(row)} {row.get('dtype')} B{row.get('batch') or 1} H{row.get('heads')} "
        f"D{row.get('head_dim')} {row.get('mode') or 'fwd'}" + (f" x{p}" if p > 1 else "")
    )


LEGEND = (
    "Labels: `impl[segment lengths/dilation rates]`; `bs:PATTERN S%/BLOCK` is block-sparse keeping S% of "
    "blocks of BLOCK tokens; then dtype, B batch, H heads, D head dim, mode (fwd, fwd_bwd), xP GPUs."
)


# --- verdicts -------------------------------------------------------------------------------------


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    why: str
    measured: Measured | None


def _side(test: str, m: Measured) -> str:
    kind, _, arg = test.partition(":")
    x = float(arg)
    low = m.low if m.low is not None else m.value
    high = m.high if m.high is not None else m.value
    if kind == "above":
        ok, bad = low > x, high <= x
    else:
        ok, bad = high < x, low >= x
    return CONFIRMED if ok else REFUTED if bad else "straddles"


def judge(claim: Claim, measured: list[Measured]) -> Verdict:
    """The verdict of one claim from its measurements (one per machine that has rows)."""
    kind, _, arg = claim.test.partition(":")
    if kind == "none":
        return Verdict(claim, NOT_COMPARABLE, claim.note, None)
    if not measured:
        needs_two = claim.gpus > 1 or any(int(mt.get("world_size") or 1) > 1 for mt in (claim.match, claim.over or {}))
        why = "needs two GPUs" if needs_two else f"`{SEEDS_COMMAND}` on one GPU measures it"
        return Verdict(claim, NOT_MEASURED, why, None)
    m = max(measured, key=lambda x: x.date)
    notes = list(m.notes)
    if claim.metric in HARDWARE_BOUND and claim.over is None:
        return Verdict(
            claim, NOT_COMPARABLE, "; ".join([f"absolute speed of {m.machine}, not of a GTX 1080", *notes]), m
        )
    if kind == "near":
        ratio = m.value / claim.seed_value if claim.seed_value else float("inf")
        verdict = CONFIRMED if abs(ratio - 1) <= float(arg) else REFUTED
        notes.insert(0, f"measured/seed {ratio:.2f} (tolerance ±{float(arg):.0%})")
    else:
        verdict = _side(claim.test, m)
        if verdict == "straddles":
            verdict = NOT_COMPARABLE
            notes.insert(0, f"anomaly: interval includes {arg}")
    return Verdict(claim, verdict, "; ".join(notes), m)


def verdicts(machines, claims: list[Claim] | None = None) -> list[Verdict]:
    claims = load_claims() if claims is None else claims
    out = []
    for c in claims:
        found = [x for x in (measure(c, m) for m in machines) if x is not None]
        out.append(judge(c, found))
    return out


# --- formatting -----------------------------------------------------------------------------------


def value_text(metric: str, v: float) -> str:
    if metric in BYTES:
        return f"{v / 1e9:.3g} GB"
    if metric in ("max_seq", "max_seq_8gb"):
        return format_tokens(int(v))
    if metric == "time_ms":
        return f"{v:,.3g} ms"
    if metric == "tokens_per_s":
        return f"{v:,.0f} tok/s"
    return f"{v:.3g}x"


def measured_text(v: Verdict) -> str:
    m = v.measured
    if m is None:
        return "-"
    metric = "ratio" if v.claim.over is not None or v.claim.per else v.claim.metric
    text = value_text(metric, m.value)
    if m.low is not None and m.high is not None:
        text += f" [{value_text(metric, m.low)}, {value_text(metric, m.high)}]"
    return f"{text} n={m.n}, {m.machine}: {m.workload}"
