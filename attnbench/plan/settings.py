"""The settings of a series, whatever its kind, and how each is read: every key checked by
type and range where it is read (a profile's top level and tables, or a command-line flag),
an error naming the key; a speedup table's keys and a sweep table's."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.measure.timing import TimingPolicy
from attnbench.trials.workload import DTYPES, MODES
from attnbench.units import brief, parse_bytes, parse_gpus, parse_int_list, parse_tokens


@dataclass(frozen=True)
class Case:
    """One speedup workload: a sequence length and a batch."""

    seq_len: int
    batch: int

    @property
    def label(self) -> str:
        return f"{self.seq_len}x{self.batch}"


#: a setting's value, as a profile or the command line gives it (``parse_settings`` checks it by
#: its key) and as ``parse_settings`` returns it: a number, text, true/false, a list, cases
SettingValue = int | float | str | bool | None | list[int | str] | tuple[int, ...] | tuple[str, ...] | tuple[Case, ...]
#: one level's settings by key: a profile's top level, a sweep or speedup table, the command line
SettingValues = dict[str, SettingValue]

SEED_CASES = "2048x8,4096x4,8192x2,16384x1"  # the seed reports' speedup cases


def parse_cases(text) -> tuple[Case, ...]:
    """'2048x8,64Kx2' (or a list of such) -> (Case(2048, 8), Case(65536, 2))."""
    cases = []
    parts = text if isinstance(text, list) else str(text).split(",")
    for part in (str(p).strip() for p in parts):
        if not part:
            continue
        m = re.fullmatch(r"([0-9]+[kKmM]?)\s*[xX*]\s*([0-9]+)", part)
        if not m or int(m.group(2)) < 1 or parse_tokens(m.group(1)) < 1:
            raise AttnbenchError(
                f"cannot read case {brief(part)}: write SEQLENxBATCH, e.g. --cases 2048x8,4096x4 or 64Kx2"
            )
        cases.append(Case(parse_tokens(m.group(1)), int(m.group(2))))
    if not cases:
        raise AttnbenchError("--cases is empty: give SEQLENxBATCH cases, e.g. --cases " + SEED_CASES)
    return tuple(dict.fromkeys(cases))


def parse_names(text) -> tuple[str, ...]:
    """'dp,mp' or ["dp", "mp"] -> ("dp", "mp"), in order, once each; ``single`` is implied."""
    names = [n.strip() for n in (text if isinstance(text, list) else str(text).split(",")) if str(n).strip()]
    return tuple(dict.fromkeys(n for n in names if n != "single"))


@dataclass(frozen=True)
class SearchSettings:
    """A capacity search's own settings (kind ``max-seq``)."""

    start: int = 0  # first length of the search; 0: the smallest multiple of the granularity >= 1024
    max_seq_len: int = 1 << 31
    resolution: int = 0  # stop bisecting at this gap (0: 1% of the answer, at least the granularity)
    # the search starts no trial it expects to end after this many seconds (None: by device)
    search_budget_s: float | None = None


@dataclass(frozen=True)
class PointsSettings:
    """Fixed lengths' own settings (kind ``points``)."""

    seq_lens: tuple[int, ...] = ()
    repeat: int = 1  # each point timed in this many fresh processes
    equal_work: bool = False  # sequence-parallel points: also time the single-device counterpart (same total work)


@dataclass(frozen=True)
class SpeedupSettings:
    """A speedup run's own settings (kind ``speedup``): (sequence length x batch) cases, on one
    GPU and spread over ``gpus[0]`` GPUs by each strategy."""

    cases: tuple[Case, ...] = ()
    strategies: tuple[str, ...] = ("dp", "mp")  # single always runs, as the baseline
    module: str = "attention"  # attention | multihead (q/k/v/out projections around it)
    grad_compression: str | None = None  # DistributedDataParallel's gradient compression (mp only)


# each kind's own settings, by the name of the group that holds them
KIND_GROUPS = {"search": SearchSettings, "points": PointsSettings, "speedup": SpeedupSettings}


@dataclass(frozen=True)
class Settings:
    """Everything about a series except the implementation and its parameters: what every
    kind shares, and each kind's own settings in its group (``search``, ``points``,
    ``speedup``). A profile and the command line name every setting by its key alone
    (``with_values``)."""

    kind: str = "max-seq"  # max-seq: the capacity search; points: the given seq_lens; speedup: cases x strategies
    device: str = "auto"
    dtype: str = "bf16"
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    mode: str = "fwd"
    causal: bool = False
    max_trial_seconds: float = 60.0
    memory_limit: int | None = None
    isolate: bool = True  # one fresh process per trial
    warmup: int = 1  # warm-up calls, at least
    warmup_s: float | None = None  # warm-up seconds, at least (None: 1 s on a GPU, 0 on the CPU)
    min_samples: int = 10
    max_samples: int = 50
    target_ms: float = 1000.0
    timing_budget_s: float = 30.0  # timed calls of one trial (the per-call limit is max_trial_seconds)
    threads: int = 1  # CPU trials: torch's intra-op threads per trial process (recorded in each row)
    label: str = ""
    gpus: tuple[int, ...] = ()  # sequence-parallel: ranks to run on (one series each); speedup: GPUs to spread over
    kv_heads: int | None = None  # key/value heads shared by groups of query heads (None: heads)
    model: str | None = None  # the model preset that filled the shape (attnbench models)
    # the part of a profile the series belongs to: `run --part NAME` runs that part alone, so a
    # long profile runs in pieces that each fit one sitting, resumed into one directory
    part: str = ""
    search: SearchSettings = field(default_factory=SearchSettings)
    points: PointsSettings = field(default_factory=PointsSettings)
    speedup: SpeedupSettings = field(default_factory=SpeedupSettings)

    def with_values(self, **values: Any) -> Settings:
        """These settings with ``values`` set, each named by its key as a profile and the
        command line name it, in the group it belongs to."""
        groups = {}
        for name, group in KIND_GROUPS.items():
            own = {k: values.pop(k) for k in _names(group) if k in values}
            if own:
                groups[name] = replace(getattr(self, name), **own)
        return replace(self, **values, **groups)

    def timing(self, budget_s: float, threads: int | None = None) -> TimingPolicy:
        """The timing plan these settings ask of a trial: ``budget_s`` seconds of timed calls
        and, on the CPU, ``threads`` (None: torch's default)."""
        return TimingPolicy(
            warmup=self.warmup,
            warmup_s=self.warmup_s,
            min_samples=self.min_samples,
            max_samples=self.max_samples,
            target_ms=self.target_ms,
            budget_s=budget_s,
            threads=threads,
        )


# key -> parser of a TOML/CLI value; the parser raises ValueError/AttnbenchError when wrong
def _int(v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("an integer")
    return v


def _float(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError("a finite number")
    return float(v)


def _at_least(low, parse, what):
    """``parse``, then refuse values below ``low`` (negative counts, zero lengths)."""

    def check(v):
        v = parse(v)
        if v < low:
            raise ValueError(what)
        return v

    return check


def _seq_lens(v) -> tuple[int, ...]:
    """Lengths to time, each positive (a zero length is no workload, whatever the granularity)."""
    lens = tuple(parse_tokens(x) for x in (v if isinstance(v, list) else parse_int_list(v, "seq_lens")))
    for n in lens:
        if n < 1:
            raise AttnbenchError(f"sequence length {n} must be positive: write e.g. 4096 or 64K")
    return lens


def _bool(v):
    if not isinstance(v, bool):
        raise ValueError("true or false")
    return v


def _choice(*allowed):
    def parse(v):
        if v not in allowed:
            raise ValueError(f"one of {', '.join(allowed)}")
        return v

    return parse


def _str(v):
    if not isinstance(v, str):
        raise ValueError("a string")
    return v


def _label(v):
    """A series' name as tables and headings show it: one line of text."""
    if not isinstance(v, str) or any(c < " " or c == "\x7f" for c in v):
        raise ValueError("one line of text (no newline or other control character)")
    return v


def _kind(v):
    """A sweep kind's name; which kinds exist is checked when the plan is resolved (the
    kinds are registered with the sweeps, above this module)."""
    if not isinstance(v, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", v):
        raise ValueError("a kind's name, e.g. max-seq or points")
    return v


def parse_part(v):
    if not isinstance(v, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", v):
        raise ValueError("a part's name: lower-case letters, digits and '-', e.g. data-parallel")
    return v


def _gpus(v):
    """A profile's list is taken as written; one count P (flag or profile) means 1 and P."""
    if isinstance(v, list):
        if not v or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
            raise ValueError("a list of positive numbers of GPUs, e.g. [1, 2]")
        return tuple(sorted(set(v)))
    return parse_gpus(v)


SETTING_PARSERS = {
    "kind": _kind,
    "device": _choice("auto", "cpu", "cuda"),
    "dtype": _choice(*DTYPES),
    "batch": _at_least(1, _int, "a positive integer"),
    "heads": _at_least(1, _int, "a positive integer"),
    "head_dim": _at_least(1, _int, "a positive integer"),
    "mode": _choice(*MODES),
    "causal": _bool,
    "seq_lens": _seq_lens,
    "start": _at_least(0, parse_tokens, "a length >= 0 (0: the default)"),
    "max_seq_len": _at_least(1, parse_tokens, "a positive length, e.g. 64K"),
    "resolution": _at_least(0, parse_tokens, "a length >= 0"),
    "max_trial_seconds": _at_least(1e-9, _float, "a positive number of seconds"),
    "search_budget_s": _at_least(1e-9, _float, "a positive number of seconds"),
    "memory_limit": lambda v: None if v in (None, "", 0, "none") else parse_bytes(v),
    "isolate": _bool,
    "warmup": _at_least(0, _int, "an integer >= 0"),
    "min_samples": _at_least(1, _int, "an integer >= 1"),
    "max_samples": _at_least(1, _int, "an integer >= 1"),
    "warmup_s": _at_least(0, _float, "a number of seconds >= 0"),
    "timing_budget_s": _at_least(1e-9, _float, "a positive number of seconds, e.g. 30"),
    "repeat": _at_least(1, _int, "an integer >= 1 (fresh processes per timed point), e.g. 3"),
    "threads": _at_least(1, _int, "an integer >= 1 (torch threads per CPU trial), e.g. 1"),
    "target_ms": _at_least(0, _float, "a number of milliseconds >= 0"),
    "label": _label,
    "gpus": _gpus,
    "equal_work": _bool,
    "kv_heads": _at_least(1, _int, "a positive number of key/value heads (dividing heads)"),
    "model": _str,
    "cases": parse_cases,
    "strategies": parse_names,
    "module": _str,
    "grad_compression": lambda v: None if v in (None, "", "none") else _str(v),
    "part": parse_part,
}


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


#: every setting's key, as a profile and the command line name it
SETTING_KEYS = tuple(k for k in _names(Settings) if k not in KIND_GROUPS) + tuple(
    k for group in KIND_GROUPS.values() for k in _names(group)
)
assert set(SETTING_PARSERS) == set(SETTING_KEYS)
# settings a speedup table takes from the profile's top level, and those only it has
SPEEDUP_SHARED = ("device", "dtype", "heads", "head_dim", "mode", "causal", "max_trial_seconds", "part")
SPEEDUP_TIMING = ("warmup", "min_samples", "max_samples", "target_ms")
SPEEDUP_ONLY = _names(SpeedupSettings)
SPEEDUP_OWN = ("impl", *SPEEDUP_ONLY, "gpus")
# the keys of a [[sweep]] table and of a profile's top level
SWEEP_KEYS = tuple(k for k in SETTING_PARSERS if k not in SPEEDUP_ONLY)


# Settings whose command-line option is not the key with dashes.
OPTIONS = {"timing_budget_s": "--timing-budget", "isolate": "--in-process"}
COMMAND_LINE = "command line"


def parse_settings(values: SettingValues, where: str) -> SettingValues:
    """Each value by its key's type and range; an error names the key (on the command line,
    its option) and echoes the start of the value."""
    out: SettingValues = {}
    for key, value in values.items():
        name = OPTIONS.get(key, "--" + key.replace("_", "-")) if where == COMMAND_LINE else repr(key)
        try:
            out[key] = SETTING_PARSERS[key](value)
        except AttnbenchError as exc:  # already a sentence of its own
            raise AttnbenchError(f"{where}: {name}: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise AttnbenchError(f"{where}: {name} must be {exc}, got {brief(value)}") from None
    return out
