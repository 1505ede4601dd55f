"""The seed reports' claims (``seed_claims.toml``): what each says, the quantity it names and
which rows measure it, and how its numbers are written.

A claim names one quantity (``metric``) and the rows that measure it (``match``), or the ratio
of two quantities (``match`` over ``over``). ``report.measured`` gives the quantity on one
machine; whether that confirms the seed is ``report.verdicts``'s rule (docs/verdicts.md).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.report import data as d
from attnbench.report.fit import GIB
from attnbench.schema import Row
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


# --- labels -----------------------------------------------------------------------------------------


def short_label(row: Row) -> str:
    """A series with its settings in a few characters (LEGEND explains the notation)."""
    p = d.world_size(row)
    strategy = getattr(row, "strategy", None)
    how = f" {strategy}" if strategy and strategy not in ("single", "ring") else ""
    return (
        f"{d.short_name(row)} {row.dtype} B{row.batch or 1} {d.heads_text(row)} D{row.head_dim} {row.mode or 'fwd'}"
        + (f" x{p}{how}" if p > 1 or how else "")
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
