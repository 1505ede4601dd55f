"""Implementations from outside attnbench: named by import path or by installed entry point.

``--impl pkg.module:factory`` (or ``impl = "pkg.module:factory"`` in a profile) names a
factory; an installed package names its factories in the entry-point group
``attnbench.implementations``, and they appear under their entry-point names. Trial processes
and torchrun ranks resolve a name the same way, so the job only carries the name.

The contract, which a factory meets in a few lines (docs/reference/own-implementation.md):

- ``factory(**params)`` returns a ``torch.nn.Module`` whose ``forward(q, k, v, is_causal=False)``
  takes and returns ``(B, N, H, D)``. Its keyword parameters with defaults (or annotations)
  are the ``--param`` names; values given as text are converted to the default's type.
- The key sets are declared on the module one of three ways: nothing (dense), a
  ``mask_mod(b, h, q_idx, kv_idx)`` (FlexAttention's signature) or ``mask_mod_for(seq_len,
  num_heads)`` returning one for that shape, or ``key_mask(seq_len, num_heads)`` returning the
  boolean ``(H, N, N)`` (or ``(N, N)``) sets. With ``is_causal`` they are the declared sets
  intersected with ``kv_idx <= q_idx``, unless the module declares its causal sets itself:
  ``causal_mask_mod``, ``causal_mask_mod_for`` or ``causal_key_mask``.
- Optional: ``useful_pairs(seq_len, num_heads, causal)`` in closed form (else pairs are
  counted from the declaration), ``executed_pairs`` (the same signature: pairs the kernel
  computes, masked ones included), ``granularity`` (lengths run are multiples of it),
  ``min_seq_len`` (the shortest length it runs; verify checks there and above), ``compiles``
  (first call compiles kernels), ``supports_causal``, ``supports_gqa`` (True when forward takes
  k, v with fewer heads than q; otherwise attnbench copies K and V to every query head first
  and the row says so) with ``gqa_mapping``: ``"consecutive"`` (query head j reads K/V head
  j // (H / H_kv), the default) or ``"interleaved"`` (j % H_kv).
- Optional on the factory (read before anything is built): ``summary``, ``devices``,
  ``dtypes``, ``memory_order`` (2 when the implementation holds N x N scores).
- Sequence parallel: ``factory.sequence_parallel = {"counterpart": NAME}`` (optional
  ``"counterpart_params"``, ``"layout"``) declares a module that runs on its rank's shard
  inside the process group attnbench starts (``--gpus P``): ``forward`` takes and returns the
  rank's ``(B, N/P, H, D)``; its key sets and pairs are the single-device ``counterpart``'s,
  and its gathered output is checked against the float64 reference and that counterpart. The
  shard layout is the module's ``shard_layout`` (``"contiguous"``, ``"zigzag"``, ``"striped"``),
  else the declaration's ``"layout"``, else contiguous; or its own
  ``shard_positions(seq_len, world, rank, causal)``. Its ``granularity`` is per rank.

A factory may also return an :class:`AttentionImpl`, which then declares everything itself.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.base import AttentionImpl, dense_pairs, quiet_eager_flex
from attnbench.impls.config import Config, ImplSource, SequenceParallelDeclaration
from attnbench.impls.entry import Described, ImplSpec, Param, SpecFields, entry_points, is_import_path
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
    source: ImplSource = {
        "import_path": path,
        "package": package,
        "version": version,
        "source_sha256": source_hash(path),
    }
    parallel = sequence_parallel_of(path, factory)
    if parallel:
        source["sequence_parallel"] = parallel
    summary = getattr(factory, "summary", None) or (inspect.getdoc(factory) or "").split("\n")[0]
    return ImplSpec(
        name=name,
        factory=_factory(name, path, factory, source),
        summary=summary or f"outside implementation {path}",
        params=_params(path, factory),
        devices=tuple(getattr(factory, "devices", ("cpu", "cuda"))),
        dtypes=tuple(getattr(factory, "dtypes", ("fp32", "fp16", "bf16"))),
        memory_order=int(getattr(factory, "memory_order", 1)),
        source=source,
        distributed=bool(parallel),
        counterpart=parallel["counterpart"] if parallel else None,
    )


def sequence_parallel_of(path: str, factory: Callable) -> SequenceParallelDeclaration | None:
    """The factory's ``sequence_parallel`` declaration, checked (None where it makes none)."""
    declared = getattr(factory, "sequence_parallel", None)
    if declared is None or declared is False:
        return None
    fix = (
        f'{path}.sequence_parallel must be a dict such as {{"counterpart": "sdpa", "layout": "zigzag"}} '
        "(the single-device implementation computing the same key sets, and the shard layout)"
    )
    if not isinstance(declared, dict) or not isinstance(declared.get("counterpart"), str):
        raise ConfigError(fix)
    unknown = sorted(set(declared) - {"counterpart", "counterpart_params", "layout"})
    if unknown:
        raise ConfigError(f"{path}.sequence_parallel has no key {unknown[0]!r}: {fix}")
    from attnbench.impls.sequence_parallel.layouts import check_layout

    layout = declared.get("layout", "contiguous")
    check_layout(path, layout)
    params = declared.get("counterpart_params", {})
    if not isinstance(params, dict):
        raise ConfigError(f"{path}.sequence_parallel's counterpart_params must be a dict of the counterpart's --param")
    return SequenceParallelDeclaration(
        counterpart=declared["counterpart"], counterpart_params=dict(params), layout=layout
    )


def source_hash(path: str) -> str | None:
    """The first 16 hex digits of the SHA-256 of the source behind ``path``: every ``.py`` file
    of its top-level package (relative names and bytes, in name order), or its one module's file;
    None where the code has no source files. Two rows with the same hash ran the same code."""
    top = path.partition(":")[0].split(".")[0]
    module = sys.modules.get(top)
    if module is None:
        return None
    roots = [Path(p) for p in getattr(module, "__path__", [])]
    files = sorted(f for root in roots for f in root.rglob("*.py")) if roots else []
    if not roots and getattr(module, "__file__", None):
        roots, files = [Path(module.__file__).parent], [Path(module.__file__)]
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(roots[0] if f.is_relative_to(roots[0]) else f.parent)).encode() + b"\0")
        digest.update(f.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


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


def _factory(name: str, path: str, factory: Callable, source: dict[str, Any]) -> Callable[..., AttentionImpl]:
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
        parallel = source.get("sequence_parallel")
        if isinstance(module, AttentionImpl):
            impl = module
        elif isinstance(module, nn.Module) and parallel:
            from attnbench.impls.sequence_parallel.outside import OutsideSequenceParallel

            impl = OutsideSequenceParallel(module, config, parallel)
        elif isinstance(module, nn.Module):
            impl = OutsideImpl(module, config)
        else:
            raise ConfigError(
                f"{path} returned a {type(module).__name__}, not a torch.nn.Module: return a module "
                "with forward(q, k, v, is_causal=False) on (B, N, H, D)"
            )
        impl.source = dict(source)
        return impl

    return build


def described(impl: AttentionImpl) -> Described:
    """What attnbench's own process needs to know of a built outside implementation: read in
    a worker process, held by ``DescribedImpl``."""
    return Described(
        config=impl.config(),
        granularity=int(impl.granularity),
        min_seq_len=int(getattr(impl, "min_seq_len", 0)),
        verify_seq_len=int(impl.verify_seq_len()),
        compiles=bool(impl.compiles),
        supports_causal=bool(impl.supports_causal),
        supports_gqa=bool(getattr(impl, "supports_gqa", False)),
        counted_pairs=bool(impl.counted_pairs),
        dense_by_default=bool(impl.dense_by_default),
        declares=getattr(impl, "declares", "dense"),
        gqa_mapping=impl.gqa_mapping,
        pairs_source=impl.pairs_source(),
        code_source=getattr(impl, "source", None),
        shard_layout=getattr(impl, "layout", None),
        rank_granularity=int(getattr(impl, "rank_granularity", 1)),
    )


def spec_fields(spec: ImplSpec) -> SpecFields:
    """An outside spec as its worker sends it (its factory stays where it was imported)."""
    return SpecFields(
        summary=spec.summary,
        params=[(p.name, p.default, p.help, p.kind) for p in spec.params],
        devices=list(spec.devices),
        dtypes=list(spec.dtypes),
        memory_order=spec.memory_order,
        code_source=spec.source,
        distributed=spec.distributed,
        counterpart=spec.counterpart,
    )


def described_spec(name: str, fields: SpecFields, factory: Callable[..., AttentionImpl]) -> ImplSpec:
    """The spec of ``spec_fields``, building with ``factory`` (which never runs the code)."""
    return ImplSpec(
        name=name,
        factory=factory,
        summary=fields.summary,
        params=tuple(Param(n, default, help, kind=kind) for n, default, help, kind in fields.params),
        devices=tuple(fields.devices),
        dtypes=tuple(fields.dtypes),
        memory_order=int(fields.memory_order),
        source=fields.code_source,
        distributed=fields.distributed,
        counterpart=fields.counterpart,
    )


class DescribedImpl(AttentionImpl):
    """An outside implementation as attnbench's own process knows it: what a worker process
    read of it (``described``), never its code. Its shape rules are its granularity's; calling
    it is an error, since outside code runs only in worker processes."""

    def __init__(self, fields: Described) -> None:
        super().__init__()
        self.fields = fields
        self.compiles = fields.compiles
        self.supports_causal = fields.supports_causal
        self.supports_gqa = fields.supports_gqa
        self.counted_pairs = fields.counted_pairs
        self.dense_by_default = fields.dense_by_default
        self.declares = fields.declares
        self.gqa_mapping = fields.gqa_mapping
        self.min_seq_len = fields.min_seq_len
        self.source = fields.code_source
        #: a sequence-parallel one's ranks (``impls.build_for_ranks``); its shape rules follow them
        self.world_size: int | None = None

    @property
    def granularity(self) -> int:
        layout = self.fields.shard_layout
        if layout is None:
            return self.fields.granularity
        from attnbench.impls.sequence_parallel.layouts import LAYOUTS

        pieces = LAYOUTS[layout][1] if layout in LAYOUTS else 1
        return pieces * (self.world_size or 1) * self.fields.rank_granularity

    def check_length(self, seq_len: int) -> None:
        super().check_length(seq_len)
        check_min_length(self.name, seq_len, self.min_seq_len)

    def pairs_source(self) -> str | None:
        return self.fields.pairs_source

    def verify_seq_len(self) -> int:
        if self.fields.shard_layout is not None:
            return max(self.granularity, 128)
        return self.fields.verify_seq_len

    def config(self) -> Config:
        return dict(self.fields.config)

    def forward(self, q, k, v, is_causal: bool = False):
        raise ConfigError(f"{self.name} is outside code: it runs only in a worker process of its own, not here")

    # --- a sequence-parallel one: its pairs are its counterpart's --------------------------
    def _counterpart(self) -> AttentionImpl | None:
        parallel = (self.source or {}).get("sequence_parallel")
        if not parallel:
            return None
        from attnbench import impls

        return impls.build(parallel["counterpart"], **parallel.get("counterpart_params", {}))

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return self._pairs_of_counterpart("useful_pairs", seq_len, num_heads, causal)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return self._pairs_of_counterpart("executed_pairs", seq_len, num_heads, causal)

    def _pairs_of_counterpart(self, which: str, seq_len: int, num_heads: int, causal: bool) -> int:
        from attnbench.masks.bounds import CountRefused

        counterpart = self._counterpart()
        if counterpart is None or isinstance(counterpart, DescribedImpl):
            # outside code's declarations are read only in a worker process
            raise CountRefused(
                f"{self.name}'s counterpart is outside code, whose pairs are not counted for a sequence-parallel "
                "row; name a built-in counterpart (sdpa, dilated, ...) for its FLOPs"
            )
        return getattr(counterpart, which)(seq_len, num_heads, causal)

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        raise ConfigError(f"{self.name} is outside code: its key sets are read only in a worker process")


def check_min_length(name: str, seq_len: int, min_seq_len: int) -> None:
    """A length below the module's ``min_seq_len`` is refused, naming the fix."""
    if seq_len < min_seq_len:
        raise ConfigError(
            f"{name}: sequence length {seq_len} is below its min_seq_len {min_seq_len}: start at or above it"
        )


# How a module declares its key sets, by attribute: without is_causal, and its own causal sets
# (else the former intersected with kv_idx <= q_idx).
MASK_MOD_NAMES = ("mask_mod", "mask_mod_for", "causal_mask_mod", "causal_mask_mod_for")
KEY_MASK_NAMES = ("key_mask", "causal_key_mask")
GQA_MAPPINGS = ("consecutive", "interleaved")


class OutsideImpl(AttentionImpl):
    """A user's module behind the attnbench contract: key sets and pair counts from what it declares."""

    def __init__(self, inner: nn.Module, config: dict[str, Any]) -> None:
        super().__init__()
        self.inner = inner
        self._config = dict(config)
        self.compiles = bool(getattr(inner, "compiles", False))
        self.supports_causal = bool(getattr(inner, "supports_causal", True))
        self.supports_gqa = bool(getattr(inner, "supports_gqa", False))
        self.min_seq_len = int(getattr(inner, "min_seq_len", 0) or 0)
        self._pairs: dict[tuple[int, int, bool], int] = {}
        kind = type(inner).__name__
        for attr in (*MASK_MOD_NAMES, *KEY_MASK_NAMES):
            value = getattr(inner, attr, None)
            if value is not None and not callable(value):
                raise ConfigError(
                    f"{kind}.{attr} is a {type(value).__name__}, not callable: see the declarations in "
                    "docs/reference/own-implementation.md (mask_mod(b, h, q_idx, kv_idx) returning booleans)"
                )
        mapping = getattr(inner, "gqa_mapping", "consecutive")
        if mapping not in GQA_MAPPINGS:
            raise ConfigError(
                f"{kind}.gqa_mapping is {mapping!r}: write 'consecutive' (j // (H / H_kv)) or 'interleaved' (j % H_kv)"
            )
        # attnbench's own copy of K/V (without supports_gqa) is consecutive, whatever the module says
        self.gqa_mapping = mapping if self.supports_gqa else "consecutive"
        self.counted_pairs = self.declares != "dense" and not self._declared("useful_pairs")
        self.dense_by_default = self.declares == "dense" and not self._declared("useful_pairs")
        #: how useful_pairs was obtained: declared (the module's), closed-form (dense), blocks or exact
        self.pairs_counted = "declared" if self._declared("useful_pairs") else "closed-form"

    def _declared(self, attr: str) -> bool:
        return callable(getattr(self.inner, attr, None))

    @property
    def declares(self) -> str:
        """How the key sets are declared: mask_mod (any of its forms), key_mask or dense."""
        if any(self._declared(a) for a in MASK_MOD_NAMES):
            return "mask_mod"
        return "key_mask" if any(self._declared(a) for a in KEY_MASK_NAMES) else "dense"

    @property
    def granularity(self) -> int:
        return int(getattr(self.inner, "granularity", 1))

    def check_length(self, seq_len: int) -> None:
        super().check_length(seq_len)
        check_min_length(self.name or type(self.inner).__name__, seq_len, self.min_seq_len)

    def verify_seq_len(self) -> int:
        g = self.granularity
        return max(super().verify_seq_len(), -(-self.min_seq_len // g) * g)

    def config(self) -> Config:
        return dict(self._config)

    def forward(self, q, k, v, is_causal: bool = False):
        if not self.supports_gqa:
            k, v = gqa.expanded_for(self, q, k, v)
        with quiet_eager_flex():
            out = self.inner(q, k, v, is_causal=is_causal)
        self.last_backend = getattr(self.inner, "last_backend", None)
        return out

    # --- the declared key sets ----------------------------------------------------------
    def mask_mod_at(self, seq_len: int, num_heads: int, causal: bool):
        """The mask_mod of this shape (its own causal one where declared), or None where the
        module declares none."""
        from attnbench.masks import mask_mod

        if causal:
            own = self._mask_mod_named("causal_mask_mod", seq_len, num_heads)
            if own is not None:
                return own
        base = self._mask_mod_named("mask_mod", seq_len, num_heads)
        return mask_mod.with_causal(base) if causal and base is not None else base

    def _mask_mod_named(self, name: str, seq_len: int, num_heads: int):
        if self._declared(f"{name}_for"):
            made = getattr(self.inner, f"{name}_for")(seq_len, num_heads)
            if not callable(made):
                raise ConfigError(
                    f"{type(self.inner).__name__}.{name}_for({seq_len}, {num_heads}) returned a "
                    f"{type(made).__name__}, not a mask_mod(b, h, q_idx, kv_idx)"
                )
            return made
        return getattr(self.inner, name) if self._declared(name) else None

    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        from attnbench.masks import mask_mod

        self.check_shape(seq_len, num_heads)
        if self.declares == "mask_mod":
            mod = self.mask_mod_at(seq_len, num_heads, causal)
            if mod is not None:
                return mask_mod.key_mask(mod, seq_len, num_heads)
        tril = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        if causal and self._declared("causal_key_mask"):
            return self._own_mask("causal_key_mask", seq_len, num_heads)
        if self._declared("key_mask"):
            mask = self._own_mask("key_mask", seq_len, num_heads)
        else:  # dense, or a causal declaration alone
            mask = torch.ones(num_heads, seq_len, seq_len, dtype=torch.bool)
        return mask & tril if causal else mask

    def _own_mask(self, name: str, seq_len: int, num_heads: int) -> torch.Tensor:
        mask = torch.as_tensor(getattr(self.inner, name)(seq_len, num_heads)).to("cpu", torch.bool)
        if mask.shape not in ((seq_len, seq_len), (num_heads, seq_len, seq_len)):
            raise ConfigError(
                f"{type(self.inner).__name__}.{name}({seq_len}, {num_heads}) has shape "
                f"{tuple(mask.shape)}: return (H, N, N) or (N, N) booleans"
            )
        return mask.expand(num_heads, seq_len, seq_len)

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        return self.key_mask(seq_len, num_heads, causal=False)

    # --- pairs ----------------------------------------------------------------------------
    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        if self._declared("useful_pairs"):
            return int(self.inner.useful_pairs(seq_len, num_heads, causal))
        if self.declares == "dense":
            return dense_pairs(seq_len, num_heads, causal)
        key = (seq_len, num_heads, causal)
        if key not in self._pairs:
            self._pairs[key] = self._count(seq_len, num_heads, causal)
        return self._pairs[key]

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        if self._declared("executed_pairs"):
            return int(self.inner.executed_pairs(seq_len, num_heads, causal))
        return self.useful_pairs(seq_len, num_heads, causal)

    def pairs_source(self) -> str | None:
        """The module's own functions behind the pair counts, by qualified name; its declaration
        where attnbench counts them."""
        kind = f"{type(self.inner).__module__}.{type(self.inner).__qualname__}"
        said = [f"{kind}.{f}" for f in ("useful_pairs", "executed_pairs") if self._declared(f)]
        if not self._declared("useful_pairs") and self.declares != "dense":
            said.insert(0, f"counted from {kind}'s {self.declares}")
        return "; ".join(said) or None

    def _count(self, seq_len: int, num_heads: int, causal: bool) -> int:
        from attnbench.masks import mask_mod

        if self.declares == "mask_mod":
            mod = self.mask_mod_at(seq_len, num_heads, causal)
            if mod is not None:
                pairs, self.pairs_counted = mask_mod.count_pairs(mod, seq_len, num_heads)
                return pairs
        if seq_len * seq_len * num_heads > mask_mod.EXACT_MAX_EVALUATIONS:
            raise mask_mod.CountRefused(
                f"{self.declares} declares its key sets as an N x N tensor: at N={seq_len:,} it holds "
                f"{seq_len * seq_len * num_heads:.1e} entries; declare a mask_mod or useful_pairs"
            )
        self.pairs_counted = "exact"
        return int(self.key_mask(seq_len, num_heads, causal).sum())
