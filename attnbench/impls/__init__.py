"""Registry of attention implementations: a name maps to a factory and what it supports.

``build(name, **config)`` returns an :class:`AttentionImpl`; ``names()`` lists what is
registered; ``spec(name)`` gives the entry (parameters, devices, dtypes). The built-in ones
are declared in ``families/`` without torch, their code named by ``Lazy("module:function")``
and imported when first built: the command line checks its options, ``attnbench list`` lists
and the report reads them, none importing torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attnbench.errors import AttnbenchError, ConfigError
from attnbench.impls.config import Config, ImplSource
from attnbench.registry import Registry, did_you_mean
from attnbench.units import brief

if TYPE_CHECKING:
    from attnbench.impls.base import AttentionImpl
    from attnbench.impls.entry import ImplSpec, Param

# the built-in implementations, each family declared by its module in families/ (dense first)
BUILT_IN: Registry[ImplSpec] = Registry("implementation", f"{__name__}.families", first="dense")
_OUTSIDE: dict[str, ImplSpec] = {}  # import paths and entry points resolved so far
# How outside code is reached: None imports it here (library use); the command line installs a
# resolver of outside names and a builder of any configuration that runs outside code, neither
# of which imports it into its own process (attnbench.trials.supervised).
_outside_resolver: Callable[[str], ImplSpec | None] | None = None
_outside_builder: Callable[[str, dict[str, Any]], AttentionImpl] | None = None


def resolve_outside_with(
    resolver: Callable[[str], ImplSpec | None] | None,
    builder: Callable[[str, dict[str, Any]], AttentionImpl] | None = None,
) -> None:
    """From now on resolve outside names with ``resolver`` and build what runs outside code
    (``names_outside_code``) with ``builder``; None, None: here, as a library does."""
    global _outside_resolver, _outside_builder
    _outside_resolver, _outside_builder = resolver, builder
    _OUTSIDE.clear()


def names_outside_code(name: str, config: dict[str, Any] | None = None) -> bool:
    """Whether building ``name`` with ``config`` runs code from outside attnbench: an
    implementation named by import path or entry point, or a parameter naming a function
    whose module is not attnbench's (flex's mask)."""
    if not is_builtin(name):
        return True
    return any(p.names_code and _outside_path((config or {}).get(p.name)) for p in BUILT_IN.entries()[name].params)


def _outside_path(value: Any) -> bool:
    return isinstance(value, str) and ":" in value and value.split(":")[0].split(".")[0] != "attnbench"


def outside_code_elsewhere(name: str, config: dict[str, Any] | None = None) -> bool:
    """Whether ``name`` with ``config`` runs outside code, which this process leaves to
    worker processes."""
    return _outside_resolver is not None and names_outside_code(name, config)


def is_builtin(name: str) -> bool:
    return name in BUILT_IN.entries()


def register(spec: ImplSpec) -> ImplSpec:
    return BUILT_IN.register(spec.name, spec)


def names() -> list[str]:
    """Built-in implementations, then installed ones (entry points; nothing imported)."""
    from attnbench.impls.entry import entry_points

    built_in = BUILT_IN.entries()
    return list(built_in) + [n for n in entry_points() if n not in built_in]


def spec(name: str) -> ImplSpec:
    """A built-in by name; else an import path ``pkg.module:factory`` or an installed entry
    point, imported on first use (the only way user code is imported)."""
    from attnbench.impls.entry import entry_points, is_import_path

    if is_builtin(name):
        return BUILT_IN.entries()[name]
    if name not in _OUTSIDE:
        # a name that is neither: refused before outside.py's torch import (a typo costs no seconds)
        found = _find_outside(name) if is_import_path(name) or name in entry_points() else None
        if found is None:
            raise AttnbenchError(
                f"unknown implementation {brief(name)}{did_you_mean(name, names())}: choose one of "
                f"{', '.join(names())} (see `attnbench list`) or name your own as pkg.module:factory"
            )
        _OUTSIDE[name] = found
    return _OUTSIDE[name]


def _find_outside(name: str) -> ImplSpec | None:
    from attnbench.impls import outside

    return (_outside_resolver or outside.find_spec)(name)


def normalize_config(name: str, config: Config) -> Config:
    """Fill defaults, reject unknown parameters and coerce types; names the bad key."""
    entry = spec(name)
    known = {p.name: p for p in entry.params}
    unknown = sorted(set(config) - set(known))
    if unknown:
        allowed = ", ".join(known) or "none"
        raise ConfigError(f"{name} has no parameter {brief(unknown[0])}: its parameters are {allowed}")
    out = {}
    for p in entry.params:
        value = _coerce(name, p, config.get(p.name, p.default))
        if p.recorded_at_default or value != p.default:
            out[p.name] = value
    return out


def build(name: str, **config: Any) -> AttentionImpl:
    """Build a registered implementation with its configuration checked; one that runs
    outside code is built by the installed builder where one is (never here)."""
    entry = spec(name)
    config = normalize_config(name, config)
    if _outside_builder is not None and is_builtin(name) and names_outside_code(name, config):
        impl = _outside_builder(name, config)
    else:
        impl = entry.factory(**config)
    impl.name = name
    return impl


def build_for_ranks(name: str, config: dict[str, Any], world: int) -> AttentionImpl:
    """``build``, with a sequence-parallel implementation bound to ``world`` ranks (its shape
    rules depend on it)."""
    impl = build(name, **config)
    if spec(name).distributed:
        impl.world_size = world
    return impl


def recorded_source(name: str) -> ImplSource | None:
    """What a result row records of an outside implementation (``impl_source``), so the report
    never imports it: where it came from (import path, package, version) and its memory order."""
    entry = spec(name)
    return ImplSource(**entry.source, memory_order=entry.memory_order) if entry.source else None


def counterpart(name: str, source: dict[str, Any] | None = None) -> str | None:
    """The single-device counterpart of a sequence-parallel implementation (the report's
    baseline for it): a built-in's declared one, an outside one's as its rows recorded it
    (``source``: the row's ``impl_source``); None for others. Never imports user code."""
    if is_builtin(name):
        return BUILT_IN.entries()[name].counterpart
    return ((source or {}).get("sequence_parallel") or {}).get("counterpart")


def family(name: str, source: dict[str, Any] | None = None) -> str | None:
    """The family the report draws ``name`` with (``ImplSpec.family``): a built-in's declared
    one, an outside implementation's the package its rows recorded (``source``: the row's
    ``impl_source``); never imports its code."""
    from attnbench.impls.entry import package_family

    return BUILT_IN.entries()[name].family if is_builtin(name) else package_family((source or {}).get("package"))


def short_name(name: str, config: dict[str, Any]) -> str:
    """``name`` with ``config`` in a few characters, as the report's tables name it
    (``ImplSpec.short_name``); an implementation that declares none, by its name."""
    entry = BUILT_IN.entries().get(name)
    return entry.short_name(config) if entry and entry.short_name else name


def shown(name: str) -> tuple[str, ...]:
    """The parameters ``short_name`` shows of ``name``'s configurations."""
    return BUILT_IN.entries()[name].shown if is_builtin(name) else ()


def memory_order(name: str, row: dict[str, Any] | None = None) -> int:
    """Memory order of a measured implementation: as recorded in its row (outside ones),
    else from the built-in's spec; never imports user code."""
    recorded = (row or {}).get("impl_source") or {}
    if "memory_order" in recorded:
        return int(recorded["memory_order"])
    return BUILT_IN.entries()[name].memory_order if is_builtin(name) else 1


_BOOL_TEXT = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _coerce(impl: str, p: Param, value: Any) -> Any:
    from attnbench.units import parse_int_list

    where = f"{impl}: parameter {p.name!r}"
    try:
        if p.kind == "ints":
            value = parse_int_list(value, p.name) if value is not None else None
        elif p.kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            value = int(value)
        elif p.kind == "float":
            value = float(value)
        elif p.kind == "bool":
            if isinstance(value, str) and value.strip().lower() in _BOOL_TEXT:
                value = _BOOL_TEXT[value.strip().lower()]  # --param hilbert=true
            if not isinstance(value, bool):
                raise ValueError
        elif p.kind == "str":
            value = None if value is None else str(value)
    except (TypeError, ValueError, AttnbenchError):
        raise ConfigError(f"{where} must be of type {p.kind}, got {brief(value)}") from None
    if p.choices is not None and value not in p.choices:
        raise ConfigError(f"{where} must be one of {', '.join(p.choices)}, got {brief(value)}")
    return value


def import_code() -> None:
    """Import every built-in implementation's code (and torch with it), as a spare worker does
    before its trial so the trial does not wait for it."""
    from attnbench.impls.entry import Lazy

    for entry in BUILT_IN.entries().values():
        if isinstance(entry.factory, Lazy):
            entry.factory.target()


__all__ = [
    "build",
    "build_for_ranks",
    "names",
    "spec",
    "register",
    "normalize_config",
]
