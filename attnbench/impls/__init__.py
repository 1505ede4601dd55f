"""Registry of attention implementations: a name maps to a factory and what it supports.

``build(name, **config)`` returns an :class:`AttentionImpl`; ``names()`` lists what is
registered; ``spec(name)`` gives the entry (parameters, devices, dtypes).
"""

from __future__ import annotations

from typing import Any

from attnbench.errors import AttnbenchError, ConfigError
from attnbench.impls.base import AttentionImpl, ImplSpec, Param

_REGISTRY: dict[str, ImplSpec] = {}


def register(spec: ImplSpec) -> ImplSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"implementation {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def spec(name: str) -> ImplSpec:
    _load()
    if name not in _REGISTRY:
        raise AttnbenchError(
            f"unknown implementation {name!r}: choose one of {', '.join(_REGISTRY)} (see `attnbench list`)"
        )
    return _REGISTRY[name]


def normalize_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults, reject unknown parameters and coerce types; names the bad key."""
    entry = spec(name)
    known = {p.name: p for p in entry.params}
    unknown = sorted(set(config) - set(known))
    if unknown:
        allowed = ", ".join(known) or "none"
        raise ConfigError(f"{name} has no parameter {unknown[0]!r}: its parameters are {allowed}")
    out = {}
    for p in entry.params:
        value = _coerce(name, p, config.get(p.name, p.default))
        if p.recorded_at_default or value != p.default:
            out[p.name] = value
    return out


def build(name: str, **config: Any) -> AttentionImpl:
    """Build a registered implementation with its configuration checked."""
    entry = spec(name)
    impl = entry.factory(**normalize_config(name, config))
    impl.name = name
    return impl


def build_for_ranks(name: str, config: dict[str, Any], world: int) -> AttentionImpl:
    """``build``, with a sequence-parallel implementation bound to ``world`` ranks (its shape
    rules depend on it)."""
    impl = build(name, **config)
    if spec(name).distributed:
        impl.world_size = world
    return impl


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
            value = str(value)
    except (TypeError, ValueError, AttnbenchError):
        raise ConfigError(f"{where} must be of type {p.kind}, got {value!r}") from None
    if p.choices is not None and value not in p.choices:
        raise ConfigError(f"{where} must be one of {', '.join(p.choices)}, got {value!r}")
    return value


_loaded = False


def _load() -> None:
    """Import the implementation families once; each registers itself."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from attnbench.impls import (  # noqa: F401  # noqa: F401
        block_sparse,
        block_sparse_ring,  # noqa: F401  (after block_sparse: it takes its parameters)
        dense,
        dilated,
        ring,
    )


__all__ = ["AttentionImpl", "ImplSpec", "Param", "build", "build_for_ranks", "names", "spec", "register", "normalize_config"]
