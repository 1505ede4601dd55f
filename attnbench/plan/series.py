"""Series and plans: a profile (optional) and the command line's flags and parameters into
the series a sweep runs, each an implementation configuration with its settings, in the
profile's parts."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.impls.config import Config
from attnbench.plan import models
from attnbench.plan.profiles import read_profile, resolve_profile_path
from attnbench.plan.settings import (
    COMMAND_LINE,
    SPEEDUP_ONLY,
    SPEEDUP_OWN,
    SPEEDUP_SHARED,
    SPEEDUP_TIMING,
    SWEEP_KEYS,
    Settings,
    SettingValues,
    parse_settings,
)
from attnbench.trials.workload import Workload, check_heads
from attnbench.units import brief


@dataclass(frozen=True)
class Series:
    """One line of a sweep: an implementation configuration measured over lengths."""

    impl: str
    config: Config
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
        # an outside implementation's label shows every parameter: its defaults are its author's, unseen here
        every = not impls.is_builtin(self.impl)
        shown = {
            k: v
            for k, v in self.config.items()
            if v is not None
            and (every or defaults.get(k) != v or k in ("segment_lengths", "dilation_rates", "backend"))
        }
        args = ", ".join(f"{k}={_short(v)}" for k, v in shown.items())
        name = f"{self.impl}({args})" if args else self.impl
        return f"{name} x{self.world_size}" if self.distributed else name

    def granularity(self) -> int:
        return self.build().granularity

    def start(self) -> int:
        g = self.granularity()
        if self.settings.search.start:
            return self.settings.search.start
        return max(g, -(-1024 // g) * g)


def _short(v):
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class Plan:
    name: str
    series: tuple[Series, ...]
    description: str = ""
    verify: bool = True
    base: SettingValues = field(default_factory=dict)  # the profile's top-level settings, parsed
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
    entry: SettingValues,
    where: str,
    setting_keys: Collection[str] = SWEEP_KEYS,
    skip: Collection[str] = ("impl",),
    known: Callable[[str, set[str]], str] | None = None,
) -> tuple[str, SettingValues, Config]:
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


def build_plan(
    name: str,
    impl_names: list[str],
    flags: SettingValues,
    params: Config,
    profile: str | None = None,
    parts: Collection[str] = (),
) -> Plan:
    """Combine a profile (optional) with command-line ``flags`` (settings) and ``params``
    (implementation parameters, applied to every implementation that has them); ``parts``
    keeps the series of those parts of the profile only."""
    description, verify = "", True
    base: SettingValues = {}
    entries: list[SettingValues] = []
    speedups: list[SettingValues] = []
    own_models: dict[str, models.ModelShape] = {}
    declared: tuple[str, ...] = ()
    # every value by type and range first: nothing below is paid for (torch, the registry) on bad input
    flags = parse_settings({k: v for k, v in flags.items() if v is not None}, COMMAND_LINE)
    if profile:
        read = read_profile(profile)
        name, description, base, entries, verify = read.name, read.description, read.settings, read.entries, read.verify
        speedups, own_models, declared = read.speedups, read.own_models, read.parts
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
        settings = Settings().with_values(**{k: v for level in levels for k, v in level.items()})
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


def speedup_series(impl: str, config: Config, gpus: int = 2, **settings: Any) -> Series:
    """A speedup series from values already parsed (the ``speedup`` command's options)."""
    return Series(impl, config, Settings().with_values(kind="speedup", gpus=(gpus,), **settings))


def _speedup_series(entry: SettingValues, shared: SettingValues, where: str) -> Series:
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
    settings = Settings().with_values(**{**inherited, **own, "kind": "speedup", "gpus": (gpus,)})
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
        if s.distributed and s.settings.points.equal_work and s.settings.kind == "points":
            impl = s.build()
            name = impl.counterpart_name
            config = impls.normalize_config(name, impl.counterpart_config())
            baseline = Series(name, config, s.settings.with_values(gpus=(), equal_work=False, label=""), 1)
            key = repr((name, sorted(config.items()), baseline.settings))
            if key not in seen:
                seen.add(key)
                out.append(baseline)
        out.append(s)
    return out
