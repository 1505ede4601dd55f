"""What a sweep will run: settings from built-in defaults, a TOML profile and CLI flags.

Precedence, lowest first: built-in defaults, the profile's top-level settings, the profile
entry (``[[sweep]]`` or ``[[speedup]]``), flags given on the command line. A model preset
(``model``: built in, or a profile's ``[models.NAME]``) fills heads, kv_heads, head_dim and
causal at the level that names it, under that level's own keys. Every key is checked: an
unknown key or a wrong type is an error that names the key. One settings family serves every
kind of series (max-seq, points, speedup, or a kind registered in ``attnbench.sweeps.kinds``);
what a kind does with them is that kind's business.

Over 400 lines because the settings, their parsers and the profile tables that hold them
(sweep and speedup) are one family, read together.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from attnbench import impls, models
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.trials.workload import DTYPES, MODES, Workload, check_heads
from attnbench.units import brief, parse_bytes, parse_gpus, parse_int_list, parse_tokens

# Installed, the profiles lie inside the package (setup.py); in a clone, at the repository's top.
_INSTALLED_PROFILES = Path(__file__).resolve().parent / "profiles"
PROFILE_DIR = _INSTALLED_PROFILES if _INSTALLED_PROFILES.is_dir() else _INSTALLED_PROFILES.parent.parent / "profiles"


@dataclass(frozen=True)
class Case:
    """One speedup workload: a sequence length and a batch."""

    seq_len: int
    batch: int

    @property
    def label(self) -> str:
        return f"{self.seq_len}x{self.batch}"


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
class Settings:
    """Everything about a series except the implementation and its parameters."""

    kind: str = "max-seq"  # max-seq: the capacity search; points: the given seq_lens; speedup: cases x strategies
    device: str = "auto"
    dtype: str = "bf16"
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    mode: str = "fwd"
    causal: bool = False
    seq_lens: tuple[int, ...] = ()  # for kind = points
    start: int = 0  # first length of the search; 0: the smallest multiple of the granularity >= 1024
    max_seq_len: int = 1 << 31
    resolution: int = 0  # stop bisecting at this gap (0: 1% of the answer, at least the granularity)
    max_trial_seconds: float = 60.0
    # a max-seq search starts no trial it expects to end after this many seconds (None: by device)
    search_budget_s: float | None = None
    memory_limit: int | None = None
    isolate: bool = True  # one fresh process per trial
    warmup: int = 1  # warm-up calls, at least
    warmup_s: float | None = None  # warm-up seconds, at least (None: 1 s on a GPU, 0 on the CPU)
    min_samples: int = 10
    max_samples: int = 50
    target_ms: float = 1000.0
    timing_budget_s: float = 30.0  # timed calls of one trial (the per-call limit is max_trial_seconds)
    repeat: int = 1  # a points sweep times each point in this many fresh processes
    label: str = ""
    gpus: tuple[int, ...] = ()  # sequence-parallel implementations: ranks to run on (one series each)
    equal_work: bool = False  # sequence-parallel points: also time the single-device counterpart (same total work)
    kv_heads: int | None = None  # key/value heads shared by groups of query heads (None: heads)
    model: str | None = None  # the model preset that filled the shape (attnbench models)
    # speedup: (sequence length x batch) cases, on one GPU and spread over gpus[0] GPUs by each strategy
    cases: tuple[Case, ...] = ()
    strategies: tuple[str, ...] = ("dp", "mp")  # single always runs, as the baseline
    module: str = "attention"  # attention | multihead (q/k/v/out projections around it)
    grad_compression: str | None = None  # DistributedDataParallel's gradient compression (mp only)
    # the part of a profile the series belongs to: `run --part NAME` runs that part alone, so a
    # long profile runs in pieces that each fit one sitting, resumed into one directory
    part: str = ""


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


def _part(v):
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
    "part": _part,
}
assert set(SETTING_PARSERS) == {f.name for f in fields(Settings)}
# settings a speedup table takes from the profile's top level, and those only it has
SPEEDUP_SHARED = ("device", "dtype", "heads", "head_dim", "mode", "causal", "max_trial_seconds", "part")
SPEEDUP_TIMING = ("warmup", "min_samples", "max_samples", "target_ms")
SPEEDUP_OWN = ("impl", "cases", "strategies", "module", "grad_compression", "gpus")
SPEEDUP_ONLY = ("cases", "strategies", "module", "grad_compression")
# the keys of a [[sweep]] table and of a profile's top level
SWEEP_KEYS = tuple(k for k in SETTING_PARSERS if k not in SPEEDUP_ONLY)


# Settings whose command-line option is not the key with dashes.
OPTIONS = {"timing_budget_s": "--timing-budget", "isolate": "--in-process"}
COMMAND_LINE = "command line"


def parse_settings(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Each value by its key's type and range; an error names the key (on the command line,
    its option) and echoes the start of the value."""
    out = {}
    for key, value in values.items():
        name = OPTIONS.get(key, "--" + key.replace("_", "-")) if where == COMMAND_LINE else repr(key)
        try:
            out[key] = SETTING_PARSERS[key](value)
        except AttnbenchError as exc:  # already a sentence of its own
            raise AttnbenchError(f"{where}: {name}: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise AttnbenchError(f"{where}: {name} must be {exc}, got {brief(value)}") from None
    return out


@dataclass(frozen=True)
class Series:
    """One line of a sweep: an implementation configuration measured over lengths."""

    impl: str
    config: dict[str, Any]
    settings: Settings
    world_size: int = 1  # ranks the sequence is split over (sequence-parallel implementations)

    @property
    def distributed(self) -> bool:
        return impls.spec(self.impl).distributed

    def build(self):
        """The implementation, bound to this series' ranks."""
        return impls.build_for_ranks(self.impl, self.config, self.world_size)

    def workload(self, seq_len: int, batch: int | None = None) -> Workload:
        """The call at ``seq_len`` (a speedup case names its own ``batch``)."""
        s = self.settings
        return Workload(
            impl=self.impl,
            config=self.config,
            batch=s.batch if batch is None else batch,
            seq_len=seq_len,
            heads=s.heads,
            head_dim=s.head_dim,
            dtype=s.dtype,
            device=s.device,
            mode=s.mode,
            causal=s.causal,
            kv_heads=s.kv_heads,
            model=s.model,
        )

    @property
    def name(self) -> str:
        """The series' label: the profile's, else the implementation and the parameters that
        tell it apart; then the model preset's name, if any ("sdpa(backend=cudnn) for llama3-8b")."""
        model = f" for {self.settings.model}" if self.settings.model else ""
        return self._name() + model

    def _name(self) -> str:
        if self.settings.label:
            return self.settings.label + (f" x{self.world_size}" if self.distributed else "")
        defaults = {p.name: p.default for p in impls.spec(self.impl).params}
        shown = {
            k: v
            for k, v in self.config.items()
            if v is not None and (defaults.get(k) != v or k in ("segment_lengths", "dilation_rates", "backend"))
        }
        args = ", ".join(f"{k}={_short(v)}" for k, v in shown.items())
        name = f"{self.impl}({args})" if args else self.impl
        return f"{name} x{self.world_size}" if self.distributed else name

    def granularity(self) -> int:
        return self.build().granularity

    def start(self) -> int:
        g = self.granularity()
        if self.settings.start:
            return self.settings.start
        return max(g, -(-1024 // g) * g)


def _short(v):
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class Plan:
    name: str
    series: tuple[Series, ...]
    description: str = ""
    verify: bool = True
    base: dict[str, Any] = field(default_factory=dict)  # the profile's top-level settings, parsed
    clip_ranks: bool = False  # drop rank counts the visible GPUs cannot hold (a profile's lists)
    clipped: tuple[str, ...] = ()  # what was dropped, in words (recorded in the run's env)
    parts: tuple[str, ...] = ()  # the profile's parts in order (``part`` of its tables); empty: one whole
    selected: tuple[str, ...] = ()  # the parts this run runs (empty: all)

    @property
    def speedups(self) -> tuple[Series, ...]:
        """The series of the profile's ``[[speedup]]`` tables (kind ``speedup``)."""
        return tuple(s for s in self.series if s.settings.kind == "speedup")


def _world_sizes(impl: str, settings: Settings, where: str) -> tuple[int, ...]:
    """A sequence-parallel implementation runs once per entry of ``gpus`` (default: one
    rank); the others run on one device and take no ``gpus``."""
    if impls.spec(impl).distributed:
        return settings.gpus or (1,)
    if settings.gpus and settings.gpus != (1,):
        raise AttnbenchError(
            f"{where}: {impl} runs on one device; --gpus is for the sequence-parallel implementations "
            f"({', '.join(n for n in impls.names() if impls.spec(n).distributed)}); "
            "for data parallelism across GPUs see `attnbench speedup`"
        )
    return (1,)


def split_entry(
    entry: dict[str, Any],
    where: str,
    setting_keys: Collection[str] = SWEEP_KEYS,
    skip: Collection[str] = ("impl",),
    known: Callable[[str, set[str]], str] | None = None,
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A profile entry's keys are settings (``setting_keys``, returned parsed) or the
    implementation's parameters; ``skip`` names keys the caller reads itself. Any other key is
    an error that says what is known (``known(impl, its parameters)``: a speedup table's words)."""
    if "impl" not in entry:
        raise AttnbenchError(f"{where}: missing key 'impl' (the implementation to run)")
    name = entry["impl"]
    spec = impls.spec(name)
    params = {p.name for p in spec.params}
    settings, config = {}, {}
    for key, value in entry.items():
        if key in skip:
            continue
        if key in setting_keys:
            settings[key] = value
        elif key in params:
            config[key] = value
        else:
            hint = (
                known(name, params)
                if known
                else (
                    f"not a setting and not a parameter of {name}; "
                    f"its parameters: {', '.join(sorted(params)) or 'none'}"
                )
            )
            raise AttnbenchError(f"{where}: unknown key {brief(key)} ({hint})")
    return name, parse_settings(settings, where), config


def resolve_profile_path(profile: str) -> Path:
    """The profile's file: a path as given, else a name under profiles/; a path that is not a
    regular file (a directory, a FIFO) is refused, never read."""
    path = Path(profile)
    known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.toml")))
    if path.exists() and not path.is_file():
        raise AttnbenchError(f"profile {path} is not a file (a directory?): give a TOML file or one of {known}")
    if path.exists():
        return path
    candidate = PROFILE_DIR / f"{profile}.toml"
    if candidate.is_file():
        return candidate
    raise AttnbenchError(f"profile {brief(profile)} not found: give a TOML file or one of {known}")


def load_profile(profile: str) -> tuple[str, str, dict[str, Any], list[dict[str, Any]], bool]:
    """(name, description, top-level settings, entries, verify) of a profile, all checked;
    its ``[[speedup]]`` tables come from ``load_speedup_entries``."""
    return _load_profile(profile)[:5]


def load_speedup_entries(profile: str) -> list[dict[str, Any]]:
    return _load_profile(profile)[5]


def profile_models(profile: str) -> dict[str, models.ModelShape]:
    """A profile's own model presets (``[models.NAME]`` tables)."""
    return _load_profile(profile)[6]


def _load_profile(profile: str):
    path = resolve_profile_path(profile)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AttnbenchError(f"profile {path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise AttnbenchError(f"cannot read profile {path} ({exc.strerror}): check its permissions") from None
    description = data.pop("description", "")
    verify = data.pop("verify", True)
    parts = data.pop("parts", [])
    if not isinstance(parts, list) or len(set(parts)) != len(parts):
        raise AttnbenchError(f"profile {path}: 'parts' must list each part once, in the order they run")
    try:
        parts = [_part(p) for p in parts]
    except ValueError as exc:
        raise AttnbenchError(f"profile {path}: 'parts' names {exc}") from None
    if not isinstance(verify, bool):
        raise AttnbenchError(f"profile {path}: 'verify' must be true or false")
    entries = data.pop("sweep", [])
    speedups = data.pop("speedup", [])
    own_models = models.parse_table(data.pop("models", {}), f"profile {path}")
    for what in (entries, speedups):
        if not isinstance(what, list) or not all(isinstance(e, dict) for e in what):
            raise AttnbenchError(f"profile {path}: [[sweep]] and [[speedup]] must be tables with an 'impl' key")
    if not entries and not speedups:
        raise AttnbenchError(f"profile {path}: needs at least one [[sweep]] or [[speedup]] table with an 'impl' key")
    unknown = sorted(set(data) - set(SWEEP_KEYS))
    if unknown:
        raise AttnbenchError(f"profile {path}: unknown key {brief(unknown[0])} (settings: {', '.join(SWEEP_KEYS)})")
    for i, entry in enumerate(entries, 1):
        _check_entry(entry, f"profile {path.stem}, sweep {i}", SWEEP_KEYS)
    for i, entry in enumerate(speedups, 1):
        _check_entry(entry, f"profile {path.stem}, speedup {i}", SPEEDUP_SHARED + SPEEDUP_TIMING + SPEEDUP_ONLY)
    settings = parse_settings(data, f"profile {path}")
    return path.stem, str(description), settings, entries, verify, speedups, own_models, tuple(parts)


def _check_entry(entry: dict[str, Any], where: str, setting_keys: Collection[str]) -> None:
    """What a table's keys must be whatever the implementation: ``impl`` a name, its settings
    of their type and range. Checked while the profile is read, before torch is imported;
    the implementation's own parameters are checked once it is known (``split_entry``)."""
    impl = entry.get("impl")
    if not isinstance(impl, str) or not impl.strip():
        raise AttnbenchError(
            f"{where}: 'impl' must be an implementation's name, e.g. impl = \"sdpa\" (see `attnbench list`), "
            f"got {brief(impl)}"
        )
    parse_settings({k: v for k, v in entry.items() if k in setting_keys}, where)


def build_plan(
    name: str,
    impl_names: list[str],
    flags: dict[str, Any],
    params: dict[str, Any],
    profile: str | None = None,
    parts: Collection[str] = (),
) -> Plan:
    """Combine a profile (optional) with command-line ``flags`` (settings) and ``params``
    (implementation parameters, applied to every implementation that has them); ``parts``
    keeps the series of those parts of the profile only."""
    description, verify = "", True
    base: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    speedups: list[dict[str, Any]] = []
    own_models: dict[str, models.ModelShape] = {}
    declared: tuple[str, ...] = ()
    # every value by type and range first: nothing below is paid for (torch, the registry) on bad input
    flags = parse_settings({k: v for k, v in flags.items() if v is not None}, COMMAND_LINE)
    if profile:
        name, description, base, entries, verify, speedups, own_models, declared = _load_profile(profile)
        path = resolve_profile_path(profile)
        if impl_names:
            for n in impl_names:
                impls.spec(n)
            entries = [e for e in entries if e.get("impl") in impl_names]
            speedups = [e for e in speedups if e.get("impl") in impl_names]
            if not entries and not speedups:
                raise AttnbenchError(f"profile {path} has no sweep for {', '.join(impl_names)}")
    else:
        if not impl_names:
            raise AttnbenchError("name an implementation (see `attnbench list`) or a profile")
        entries = [{"impl": n} for n in impl_names]
    used_params: set[str] = set()
    series = []
    for i, entry in enumerate(entries, 1):
        where = f"profile {name}, sweep {i}" if profile else "command line"
        impl, entry_settings, config = split_entry(entry, where)
        own = {p.name for p in impls.spec(impl).params}
        config.update({k: v for k, v in params.items() if k in own})
        used_params |= own & set(params)
        levels = (models.filled(level, own_models) for level in (base, entry_settings, flags))
        settings = replace(Settings(), **{k: v for level in levels for k, v in level.items()})
        try:
            check_heads(settings.heads, settings.kv_heads)
        except AttnbenchError as exc:
            raise AttnbenchError(f"{where}: {exc}" + (f" (model {settings.model})" if settings.model else "")) from None
        try:
            config = impls.normalize_config(impl, config)
        except ConfigError as exc:
            raise AttnbenchError(f"{where}: {exc}") from None
        series.extend(Series(impl, config, settings, world) for world in _world_sizes(impl, settings, where))
    series = _with_equal_work_baselines(series)
    unused = sorted(set(params) - used_params)
    if unused:
        raise AttnbenchError(
            f"parameter {brief(unused[0])} belongs to none of {', '.join(sorted({s.impl for s in series}))}; "
            "see `attnbench list` for each implementation's parameters"
        )
    shared = {**base, **flags}
    series += [_speedup_series(e, shared, f"profile {name}, speedup {i}") for i, e in enumerate(speedups, 1)]
    # a profile's rank lists are clipped to the visible GPUs; ranks asked for on the command line are not
    clip = bool(profile) and "gpus" not in flags
    all_parts = _parts_in_order(series, declared, name)
    return Plan(
        name=name,
        series=select_parts(series, all_parts, tuple(parts), name),
        description=description,
        verify=verify,
        base=base,
        clip_ranks=clip,
        parts=all_parts,
        selected=tuple(dict.fromkeys(parts)),
    )


def _parts_in_order(series: list[Series], declared: tuple[str, ...], name: str) -> tuple[str, ...]:
    """The profile's parts in the order its ``parts`` key gives (a table naming another part is
    an error), or in the order the tables name them where the profile declares none."""
    named = tuple(dict.fromkeys(s.settings.part for s in series if s.settings.part))
    for p in named:
        if declared and p not in declared:
            raise AttnbenchError(
                f"profile {name}: part {p!r} is not in its parts ({', '.join(declared)}); add it there"
            )
    return declared or named


def select_parts(
    series: list[Series], known: tuple[str, ...], wanted: tuple[str, ...], name: str
) -> tuple[Series, ...]:
    """The series of the ``wanted`` parts (all when none is named), part by part in the profile's
    order; an unknown part names the known ones."""
    for p in wanted:
        if p not in known:
            have = f"its parts: {', '.join(known)}" if known else "it has no parts (it runs whole)"
            raise AttnbenchError(f"--part {p!r}: profile {name} has no such part; {have}")
    chosen = [s for s in series if not wanted or s.settings.part in wanted]
    return tuple(sorted(chosen, key=lambda s: known.index(s.settings.part) if s.settings.part in known else -1))


def speedup_series(impl: str, config: dict[str, Any], gpus: int = 2, **settings: Any) -> Series:
    """A speedup series from values already parsed (the ``speedup`` command's options)."""
    return Series(impl, config, replace(Settings(), kind="speedup", gpus=(gpus,), **settings))


def _speedup_series(entry: dict[str, Any], shared: dict[str, Any], where: str) -> Series:
    """A ``[[speedup]]`` table: the implementation and its parameters, ``cases`` (SEQLENxBATCH,
    a list or one comma-separated string), ``strategies``, ``module``, ``grad_compression`` and
    ``gpus`` (GPUs to spread over; on the CPU, processes); the profile's top-level settings a
    speedup run has apply unless the table sets its own. ``device`` may still be ``auto``."""

    def known(impl: str, params: set[str]) -> str:
        keys = SPEEDUP_OWN + SPEEDUP_SHARED + SPEEDUP_TIMING
        return f"speedup keys: {', '.join(keys)}; parameters of {impl}: {', '.join(sorted(params)) or 'none'}"

    impl, own, config = split_entry(
        entry, where, SPEEDUP_SHARED + SPEEDUP_TIMING + SPEEDUP_ONLY, ("impl", "gpus"), known
    )
    if "cases" not in own:
        raise AttnbenchError(f'{where}: missing key \'cases\', e.g. cases = ["2048x8", "4096x4"]')
    gpus = entry.get("gpus", 2)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise AttnbenchError(f"{where}: 'gpus' must be a positive number of GPUs, got {brief(gpus)}")
    inherited = {k: v for k, v in shared.items() if k in SPEEDUP_SHARED + SPEEDUP_TIMING}
    settings = replace(Settings(), **{**inherited, **own, "kind": "speedup", "gpus": (gpus,)})
    try:
        config = impls.normalize_config(impl, config)
    except ConfigError as exc:
        raise AttnbenchError(f"{where}: {exc}") from None
    return Series(impl, config, settings)


def _with_equal_work_baselines(series: list[Series]) -> list[Series]:
    """Before each sequence-parallel points series with ``equal_work``, its single-device
    counterpart (the implementation that computes the same key sets on one device: sdpa for
    ring, dilated for ring-dilated) at the same lengths: the equal-work baseline of its
    scaling efficiency. The same implementation on one rank stays as the same-split baseline."""
    out: list[Series] = []
    seen: set[str] = set()
    for s in series:
        if s.distributed and s.settings.equal_work and s.settings.kind == "points":
            impl = s.build()
            name = impl.counterpart_name
            config = impls.normalize_config(name, impl.counterpart_config())
            baseline = Series(name, config, replace(s.settings, gpus=(), equal_work=False, label=""), 1)
            key = repr((name, sorted(config.items()), baseline.settings))
            if key not in seen:
                seen.add(key)
                out.append(baseline)
        out.append(s)
    return out
