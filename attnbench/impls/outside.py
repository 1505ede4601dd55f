"""Implementations from outside attnbench: named by import path or by installed entry point.

``--impl pkg.module:factory`` (or ``impl = "pkg.module:factory"`` in a profile) names a
factory; an installed package names its factories in the entry-point group
``attnbench.implementations``, and they appear under their entry-point names. Trial processes
and torchrun ranks resolve a name the same way, so the job only carries the name.

The contract, which a factory meets in a few lines:

- ``factory(**params)`` returns a ``torch.nn.Module`` whose ``forward(q, k, v, is_causal=False)``
  takes and returns ``(B, N, H, D)``. Its keyword parameters with defaults (or annotations)
  are the ``--param`` names; values given as text are converted to the default's type.
- The key sets are declared on the module one of three ways: nothing (dense), a
  ``mask_mod(b, h, q_idx, kv_idx)`` (FlexAttention's signature), or ``key_mask(seq_len,
  num_heads)`` returning the boolean ``(H, N, N)`` (or ``(N, N)``) sets.
- Optional: ``useful_pairs(seq_len, num_heads, causal)`` in closed form (else pairs are
  counted from the mask), ``granularity`` (lengths run are multiples of it), ``compiles``
  (first call compiles kernels), ``supports_causal``, ``supports_gqa`` (True when forward
  takes k, v with fewer heads than q, query head h reading key/value head h // (H / H_kv);
  otherwise attnbench copies K and V to every query head first and the row says so).
- Optional on the factory (read before anything is built): ``summary``, ``devices``,
  ``dtypes``, ``memory_order`` (2 when the implementation holds N x N scores).

A factory may also return an :class:`AttentionImpl`, which then declares everything itself.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch
from torch import nn

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.base import AttentionImpl, dense_pairs, quiet_eager_flex
from attnbench.impls.entry import ImplSpec, Param, entry_points, is_import_path
from attnbench.units import brief

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


def load_object(path: str, what: str = "factory") -> Any:
    """``pkg.module:attr`` imported; a one-line ConfigError naming the fix otherwise."""
    if not _IMPORT_PATH.match(path):
        raise ConfigError(f"{brief(path)} is not an import path: write pkg.module:{what}")
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise ConfigError(
            f"{path}: module {module_name!r} does not import ({first}); install it or put its directory on PYTHONPATH"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"{path}: module {module_name!r} has no attribute {attr!r}; name the {what} "
                f"defined there, pkg.module:{what}"
            )
        obj = getattr(obj, part)
    return obj


def package_of(path: str) -> tuple[str | None, str | None]:
    """(distribution, version) that provides the module of ``path``, when installed."""
    top = path.partition(":")[0].split(".")[0]
    dists = metadata.packages_distributions().get(top) or []
    if not dists:
        return None, None
    try:
        return dists[0], metadata.version(dists[0])
    except metadata.PackageNotFoundError:
        return dists[0], None


def find_spec(name: str) -> ImplSpec | None:
    """The spec of an import path or installed entry point; None when ``name`` is neither."""
    if is_import_path(name):
        path = name
    else:
        path = entry_points().get(name)
        if path is None:
            return None
    factory = load_object(path)
    if not callable(factory):
        raise ConfigError(
            f"{path} is a {type(factory).__name__}, not a factory: name a function or class that "
            "returns a torch.nn.Module"
        )
    package, version = package_of(path)
    summary = getattr(factory, "summary", None) or (inspect.getdoc(factory) or "").split("\n")[0]
    return ImplSpec(
        name=name,
        factory=_factory(name, path, factory),
        summary=summary or f"outside implementation {path}",
        params=_params(path, factory),
        devices=tuple(getattr(factory, "devices", ("cpu", "cuda"))),
        dtypes=tuple(getattr(factory, "dtypes", ("fp32", "fp16", "bf16"))),
        memory_order=int(getattr(factory, "memory_order", 1)),
        source={"import_path": path, "package": package, "version": version},
    )


def _params(path: str, factory: Callable) -> tuple[Param, ...]:
    """The factory's keyword parameters: a default or an annotation gives the type."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return ()
    out = []
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = None if p.default is p.empty else p.default
        annotation = p.annotation if p.annotation in _KINDS else type(default)
        out.append(Param(p.name, default, f"parameter of {path}", kind=_KINDS.get(annotation, "str")))
    return tuple(out)


def _factory(name: str, path: str, factory: Callable) -> Callable[..., AttentionImpl]:
    def build(**config: Any) -> AttentionImpl:
        try:
            module = factory(**config)
        except ConfigError:
            raise
        except Exception as exc:
            first = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(
                f"{path} raised {first} when built with {config or 'no parameters'}; "
                "fix the factory or its --param values"
            ) from None
        if isinstance(module, AttentionImpl):
            impl = module
        elif isinstance(module, nn.Module):
            impl = OutsideImpl(module, config)
        else:
            raise ConfigError(
                f"{path} returned a {type(module).__name__}, not a torch.nn.Module: return a module "
                "with forward(q, k, v, is_causal=False) on (B, N, H, D)"
            )
        impl.source = {"import_path": path, **dict(zip(("package", "version"), package_of(path)))}
        return impl

    return build


def described(impl: AttentionImpl) -> dict[str, Any]:
    """What attnbench's own process needs to know of a built outside implementation, as JSON:
    read in a worker process, held by ``DescribedImpl``."""
    return {
        "config": impl.config(),
        "granularity": int(impl.granularity),
        "verify_seq_len": int(impl.verify_seq_len()),
        "compiles": bool(impl.compiles),
        "supports_causal": bool(impl.supports_causal),
        "supports_gqa": bool(getattr(impl, "supports_gqa", False)),
        "source": getattr(impl, "source", None),
    }


def spec_fields(spec: ImplSpec) -> dict[str, Any]:
    """An outside spec as JSON (its factory stays where it was imported)."""
    return {
        "summary": spec.summary,
        "params": [[p.name, p.default, p.help, p.kind] for p in spec.params],
        "devices": list(spec.devices),
        "dtypes": list(spec.dtypes),
        "memory_order": spec.memory_order,
        "source": spec.source,
    }


def described_spec(name: str, fields: dict[str, Any], factory: Callable[..., AttentionImpl]) -> ImplSpec:
    """The spec of ``spec_fields``, building with ``factory`` (which never runs the code)."""
    return ImplSpec(
        name=name,
        factory=factory,
        summary=fields["summary"],
        params=tuple(Param(n, default, help, kind=kind) for n, default, help, kind in fields["params"]),
        devices=tuple(fields["devices"]),
        dtypes=tuple(fields["dtypes"]),
        memory_order=int(fields["memory_order"]),
        source=fields["source"],
    )


class DescribedImpl(AttentionImpl):
    """An outside implementation as attnbench's own process knows it: what a worker process
    read of it (``described``), never its code. Its shape rules are its granularity's; calling
    it is an error, since outside code runs only in worker processes."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        self.fields = fields
        self.compiles = fields["compiles"]
        self.supports_causal = fields["supports_causal"]
        self.supports_gqa = fields["supports_gqa"]
        self.source = fields["source"]

    @property
    def granularity(self) -> int:
        return self.fields["granularity"]

    def verify_seq_len(self) -> int:
        return self.fields["verify_seq_len"]

    def config(self) -> dict[str, Any]:
        return dict(self.fields["config"])

    def forward(self, q, k, v, is_causal: bool = False):
        raise ConfigError(f"{self.name} is outside code: it runs only in a worker process of its own, not here")

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        raise ConfigError(f"{self.name} is outside code: its key sets are read only in a worker process")


class OutsideImpl(AttentionImpl):
    """A user's module behind the attnbench contract: key sets and pair counts from what it declares."""

    def __init__(self, inner: nn.Module, config: dict[str, Any]) -> None:
        super().__init__()
        self.inner = inner
        self._config = dict(config)
        self.compiles = bool(getattr(inner, "compiles", False))
        self.supports_causal = bool(getattr(inner, "supports_causal", True))
        self.supports_gqa = bool(getattr(inner, "supports_gqa", False))
        self._device = "cpu"
        self._pairs: dict[tuple[int, int, bool], int] = {}
        #: how useful_pairs was obtained: closed-form, exact or blocks (mask_mod.count_pairs)
        self.pairs_counted = "closed-form"
        mask_mod = getattr(inner, "mask_mod", None)
        if mask_mod is not None and not callable(mask_mod):
            raise ConfigError(
                f"{type(inner).__name__}.mask_mod is a {type(mask_mod).__name__}, not callable: "
                "define mask_mod(b, h, q_idx, kv_idx) returning a boolean tensor"
            )
        self.mask_mod = mask_mod

    @property
    def declares(self) -> str:
        """How the key sets are declared: mask_mod, key_mask or dense."""
        if self.mask_mod is not None:
            return "mask_mod"
        return "key_mask" if callable(getattr(self.inner, "key_mask", None)) else "dense"

    @property
    def granularity(self) -> int:
        return int(getattr(self.inner, "granularity", 1))

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def forward(self, q, k, v, is_causal: bool = False):
        self._device = q.device.type
        if gqa.heads_differ(q, k, 2) and not self.supports_gqa:
            groups = q.shape[2] // k.shape[2]
            k, v = (gqa.expand_kv(x, groups, 2) for x in (k, v))
            self.last_kv_layout = gqa.EXPANDED
        with quiet_eager_flex():
            out = self.inner(q, k, v, is_causal=is_causal)
        self.last_backend = getattr(self.inner, "last_backend", None)
        return out

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        from attnbench.masks import mask_mod

        if self.declares == "mask_mod":
            return mask_mod.key_mask(self.mask_mod, seq_len, num_heads)
        if self.declares == "key_mask":
            mask = torch.as_tensor(self.inner.key_mask(seq_len, num_heads)).to("cpu", torch.bool)
            if mask.shape not in ((seq_len, seq_len), (num_heads, seq_len, seq_len)):
                raise ConfigError(
                    f"{type(self.inner).__name__}.key_mask({seq_len}, {num_heads}) has shape "
                    f"{tuple(mask.shape)}: return (H, N, N) or (N, N) booleans"
                )
            return mask.expand(num_heads, seq_len, seq_len)
        return torch.ones(num_heads, seq_len, seq_len, dtype=torch.bool)

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        closed_form = getattr(self.inner, "useful_pairs", None)
        if callable(closed_form):
            self.pairs_counted = "closed-form"
            return int(closed_form(seq_len, num_heads, causal))
        if self.declares == "dense":
            self.pairs_counted = "closed-form"
            return dense_pairs(seq_len, num_heads, causal)
        key = (seq_len, num_heads, causal)
        if key not in self._pairs:
            self._pairs[key] = self._count(seq_len, num_heads, causal)
        return self._pairs[key]

    def _count(self, seq_len: int, num_heads: int, causal: bool) -> int:
        from attnbench.masks import mask_mod

        if self.declares == "mask_mod":
            pairs, self.pairs_counted = mask_mod.count_pairs(self.mask_mod, seq_len, num_heads, causal, self._device)
            return pairs
        self.pairs_counted = "exact"
        return int(self.key_mask(seq_len, num_heads, causal).sum())
