"""The seed reports' claims (``seed_claims.toml``): what each says, the quantity it names and
which rows measure it, and how its numbers are written.

A claim names one quantity (``metric``) and the rows that measure it (``match``), or the ratio
of two quantities (``match`` over ``over``). ``seeds.measured`` gives the quantity on one
machine; whether that confirms the seed is ``seeds.verdicts``'s rule (docs/design/verdicts.md).

Each seed report has one dtype (its ``[[seed]]`` entry, with why): every claim of that seed is
judged in it, its matchers carry it, and only a claim whose words name another dtype ("fp16
would hold ...") matches that one.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.report import data as d
from attnbench.report.fit import GIB
from attnbench.results.schema import Row
from attnbench.units import format_tokens

CLAIMS_FILE = Path(__file__).with_name("seed_claims.toml")
METRICS = {  # what a matching row yields, in the words a verdict's reason names it by
    "speedup": "speedup over one GPU",  # single-GPU time / multi-GPU time of a speedup case
    "efficiency": "efficiency (speedup per GPU)",  # speedup / GPUs
    "time_ms": "time per call",
    "tokens_per_s": "throughput",
    "peak_bytes": "peak memory",  # the trial's peak (allocator on a GPU, resident-set growth on a CPU)
    "peak_per_gpu": "peak memory per GPU",  # the fullest GPU's (or rank's) peak
    "inputs_bytes": "memory of q, k, v",  # as allocated
    "added_bytes": "memory the call adds beyond q, k, v",  # peak minus q, k, v (output, workspace)
    "added_per_token": "memory the call adds per token",  # added_bytes over the tokens
    "bytes_per_token": "peak memory per token",  # peak per GPU over the tokens that GPU holds
    "gpu0_bytes": "GPU 0's memory",  # allocator peak of GPU 0 (GPU 1) in a multi-GPU row
    "gpu1_bytes": "GPU 1's memory",
    "max_seq": "longest sequence",  # the longest length a max-seq search ran
    "max_seq_8gb": "longest sequence in 8 GB",  # a search under an 8 GiB limit; a fit only predicts it
}
HARDWARE_BOUND = ("time_ms", "tokens_per_s")  # the speed of one device: never compared across devices
BYTES = ("peak_bytes", "peak_per_gpu", "inputs_bytes", "added_bytes", "gpu0_bytes", "gpu1_bytes")
TOKENS = ("max_seq", "max_seq_8gb")
UNIT_SCALE = {"GB": 1e9, "MB": 1e6, "KB": 1e3, "%": 0.01}  # seed units to the rows' (bytes, ratios); others as is
ROW_KEYS = tuple(
    "kind impl strategy seq_len batch world_size dtype heads head_dim mode module device memory_limit".split()
)
DTYPES = ("fp32", "fp16", "bf16")
SETTLES = ("one GPU", "two GPUs")
SEED_GPUS = {1: "one GTX 1080 (8 GB)", 2: "two GTX 1080s (8 GB each)"}  # what the seeds ran on


@dataclass(frozen=True)
class Seed:
    """One seed report's settings, stated once for all its claims."""

    id: str
    dtype: str  # the one dtype every claim of the seed is judged in
    why: str  # why that dtype: what the seed says, or what its numbers imply
    shape_stated: bool  # the seed states its heads and head dim (else its memory is judged over the floor)


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
    printed: str | None = None  # the seed's number as printed, where a trailing zero sets its rounding
    direction: str | None = None  # "above:X" or "below:X": the side of X the claim also states
    comparable: bool = True
    note: str = ""  # why it is not comparable, or how the rows stand in for the seed's workload
    pick: str = "newest"  # or "best": the largest value of the matching rows
    settles: str | None = None  # where rows that measure it come from: one GPU, two GPUs, CPU
    assumed: str = ""  # what the claim assumes where the seed states nothing (dtype, shape)
    stand_in: dict[str, Any] | None = None  # overrides of match tried where no row matches it (the note says why)
    headline: bool = False  # a finding the seed put in its summary or conclusion: what a reader took away
    compares: str = ""  # what is compared, in words, where the metric's name does not say it
    replicas: int | None = None  # DataParallel replicas the seed's own numbers show ran (GPU 1 held memory: 2)
    training: bool = False  # a claim about training (DDP): only training steps of the multi-head module measure it
    budget_gib: int = 8  # max_seq_8gb: the GPU memory the longest sequence is claimed in (8: the seeds' GTX 1080)
    projected_to: str = ""  # a projection onto another GPU: which ("an RTX 3090 (24 GB)")
    bound_stand_in: bool = False  # the stand-in is a heavier workload: its longest sequence bounds the seed's below
    rows_from: str = ""  # what would measure it where no row does, where the general suggestion is not it
    dtype: str = ""  # set from the seed's [[seed]] entry, never by the claim
    shape_stated: bool = True  # set from the seed's [[seed]] entry

    @property
    def quantity(self) -> str:
        """What is compared, in words: 'peak memory', 'throughput ratio'."""
        name = METRICS[self.metric].replace("8 GB", f"{self.budget_gib} GB")
        return self.compares or name + (" ratio" if self.over is not None else "")

    @property
    def seed_hardware(self) -> str:
        return SEED_GPUS[self.gpus] + (f", projected to {self.projected_to}" if self.projected_to else "")

    @property
    def budget(self) -> int:
        """The allocator limit a max_seq_8gb claim's searches run under, in bytes."""
        return self.budget_gib * GIB

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


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise AttnbenchError(f"cannot read seed claims {path}: {e}: fix or restore the file") from None


def load_seeds(path: Path = CLAIMS_FILE) -> dict[str, Seed]:
    """Each seed report's settings by its id."""
    return _seeds(_read(path), path)


@dataclass(frozen=True)
class Previous:
    """The verdicts an earlier rule gave, by claim id, and which rule on which rows (``rule``)."""

    rule: str
    verdict: dict[str, str]


def load_previous(path: Path = CLAIMS_FILE) -> Previous | None:
    """The previous rule's verdicts the claims file records, or None where it records none."""
    entry = _read(path).get("previous")
    if entry is None:
        return None
    try:
        return Previous(**entry)
    except TypeError as e:
        raise AttnbenchError(f"{path}: [previous]: {e}") from None


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    raw = _read(path)
    seeds = _seeds(raw, path)
    claims, seen = [], set()
    for entry in raw.get("claim", []):
        try:
            if "dtype" in entry or "shape_stated" in entry:
                raise TypeError("dtype and shape_stated are the seed's: set them in its [[seed]] entry")
            c = Claim(**entry)
        except TypeError as e:
            raise AttnbenchError(f"{path}: claim {entry.get('id', '?')}: {e}") from None
        if c.seed not in seeds:
            raise AttnbenchError(f"{path}: claim {c.id}: seed {c.seed} has no [[seed]] entry")
        in_seed_dtype(c, seeds[c.seed], path)
        side, _, threshold = (c.direction or "above:0").partition(":")
        if (
            c.metric not in METRICS
            or side not in ("above", "below")
            or not _number(threshold)
            or c.pick not in ("newest", "best")
            or (c.settles is not None and c.settles not in SETTLES)
            or c.gpus not in SEED_GPUS
            or c.id in seen
        ):
            raise AttnbenchError(
                f"{path}: claim {c.id}: metric must be one of {', '.join(METRICS)}, direction above:X or "
                f"below:X, pick newest or best, settles one of {', '.join(SETTLES)}, gpus 1 or 2, ids unique"
            )
        if c.comparable and not c.match:
            raise AttnbenchError(f"{path}: claim {c.id}: a comparable claim needs a match")
        if not c.comparable and not c.note:
            raise AttnbenchError(f"{path}: claim {c.id}: a claim that is not comparable says why in its note")
        seen.add(c.id)
        claims.append(c)
    return claims


def _seeds(raw: dict[str, Any], path: Path) -> dict[str, Seed]:
    out = {}
    for entry in raw.get("seed", []):
        try:
            s = Seed(**entry)
        except TypeError as e:
            raise AttnbenchError(f"{path}: seed {entry.get('id', '?')}: {e}") from None
        if s.dtype not in DTYPES:
            raise AttnbenchError(f"{path}: seed {s.id}: dtype must be one of {', '.join(DTYPES)}")
        out[s.id] = s
    return out


def in_seed_dtype(c: Claim, seed: Seed, path: Path) -> None:
    """Every matcher of the claim carries its seed's dtype; another dtype only where the claim's
    own words name it (a stand-in may change it: its note says why nothing measured depends on it)."""
    c.dtype, c.shape_stated = seed.dtype, seed.shape_stated
    for m in (c.match, c.over):
        if not m:
            continue
        own = m.setdefault("dtype", seed.dtype)
        if own != seed.dtype and own not in c.says:
            raise AttnbenchError(
                f"{path}: claim {c.id}: matches {own} where seed {seed.id} is judged in {seed.dtype}; "
                "only a claim whose words name another dtype may match it"
            )


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --- rows that measure a claim ----------------------------------------------------------------------


def matches(row: Row, match: dict[str, Any], ident: dict[str, Any] | None = None) -> bool:
    """Every key of ``match`` agrees with the row (a row field, else a configuration
    parameter); a list for a row field means any of its values; ``false`` also matches a
    flag the row leaves out (options that are off stay out of rows). ``ident``: the row's
    identity, where the caller holds it already."""
    if ident is None:
        ident = row.identity() if hasattr(row, "identity") else {}
    config = getattr(row, "config", None) or {}
    for key, want in match.items():
        if key in ROW_KEYS:
            have = row.kind if key == "kind" else ident.get(key, getattr(row, key, None))
            if have not in (want if isinstance(want, list) else [want]):
                return False
        elif config.get(key, False if want is False else None) != want:
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
    return f"{v:.3g}x" if abs(v) < 1000 else f"{v:,.0f}x"  # never 1e+03x
