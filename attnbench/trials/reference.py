"""The float64 dense masked reference, and verification of any registered implementation.

Every implementation is defined by its declared key sets (docs/design/semantics.md), so one reference
checks them all: build the boolean (H, N, N) mask at small N, run masked softmax attention in
float64 on the CPU, and compare with ||out - ref|| / ||ref||. With grouped heads (fewer
key/value heads than query heads) the reference reads, for query head h, key/value head
h // (H / H_kv), written out here on its own rather than taken from any implementation.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.measure.oom import classify
from attnbench.results.schema import Check, Environment, Verify, join
from attnbench.runtime.jobs import job
from attnbench.trials import diagnose
from attnbench.trials.workload import torch_dtype

# Relative-error tolerance per dtype: float32 arithmetic lands far below 1e-4; 16-bit inputs
# and outputs with float32 accumulation land at a few times their unit roundoff.
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3, "bf16": 1e-2}
# Gradients (fwd_bwd): the backward reads the rounded output and rounds each gradient once
# more after long float32 sums, so a few times the output's tolerance.
GRAD_TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 3e-2}
GRADIENTS = ("dq", "dk", "dv")


def masked_reference(
    q,
    k,
    v,
    mask: torch.Tensor,
    scale: float | None = None,
    gqa_mapping: str = "consecutive",
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """out[b,t,h] = sum_u softmax_u over M_h(t) of q.k * scale, times v; empty sets give 0.
    In float64 on ``device`` (a GPU check's reference on its GPU: the same arithmetic, a long
    length's in seconds rather than minutes), a block of heads and query rows at a time, so its
    scores stay within a chunk (``REFERENCE_CHUNK_BYTES`` on the CPU); on the CPU when done."""
    q, k, v = (x.detach().to(device, torch.float64) for x in (q, k, v))
    k, v = (kv_per_query_head(x, q.shape[2], gqa_mapping) for x in (k, v))
    batch, n, heads = q.shape[:3]
    keys = k.shape[1]
    chunk = REFERENCE_CHUNK_BYTES if q.device.type == "cpu" else GPU_REFERENCE_CHUNK_BYTES
    row_bytes = 3 * 8 * batch * keys  # one query row of one head: scores, masked scores, probabilities
    rows = max(1, min(n, chunk // row_bytes))
    step = max(1, chunk // (row_bytes * n)) if rows == n else 1  # heads at a time
    mask = mask.expand(heads, n, keys)
    out = torch.empty_like(q)
    for h in range(0, heads, step):
        for t in range(0, n, rows):
            hs, ts = slice(h, h + step), slice(t, t + rows)
            out[:, ts, hs] = masked_attention(q[:, ts, hs], k[:, :, hs], v[:, :, hs], mask[hs, ts], scale)
    return out.cpu()


def kv_per_query_head(x: torch.Tensor, heads: int, gqa_mapping: str = "consecutive") -> torch.Tensor:
    """K or V ``(B, N, H_kv, D)`` as one head per query head: query head j reads K/V head
    j // (H / H_kv) ("consecutive") or j % H_kv ("interleaved")."""
    if x.shape[2] == heads:
        return x
    group = heads // x.shape[2]
    return x.repeat(1, 1, group, 1) if gqa_mapping == "interleaved" else torch.repeat_interleave(x, group, dim=2)


def masked_attention(
    q, k, v, mask: torch.Tensor, scale: float | None = None, gqa_mapping: str = "consecutive"
) -> torch.Tensor:
    """``masked_reference``'s arithmetic in the inputs' dtype and device, differentiable: an
    empty key set's row and its gradients are zero. k, v with fewer heads than q serve groups
    of query heads (``kv_per_query_head``; their gradients sum over the group)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = (kv_per_query_head(x, q.shape[2], gqa_mapping) for x in (k, v))
    scores = torch.einsum("bthd,buhd->bhtu", q, k) * scale
    mask = mask.to(q.device)[None]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = probs.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # empty key set: zero row
    return torch.einsum("bhtu,buhd->bthd", probs, v)


def reference_bytes(case: VerifyCase) -> int:
    """About what ``masked_attention`` holds for a case in float64: scores, masked scores and
    probabilities, each (B, H, N, N) of 8 bytes."""
    return 3 * 8 * case.batch * case.heads * case.seq_len**2


# A case whose float64 reference would hold more than this is checked on its reduced twin: a
# reference of this size takes about a second on the CPU, one of gigabytes minutes or the host.
REFERENCE_BUDGET_BYTES = 256 << 20
# The reference is computed a few heads and query rows at a time, each chunk's scores about this
# size: a long check stays within a trial's memory limit. On a GPU, larger chunks keep its
# kernels busy; the implementation's own call has long returned its memory by then.
REFERENCE_CHUNK_BYTES = 32 << 20
GPU_REFERENCE_CHUNK_BYTES = 1 << 30
# Under a memory limit, a long check's reference (one head's scores) takes at most this share of
# it: the implementation's own call at that length needs the rest.
LONG_CHECK_MEMORY_SHARE = 0.25


def reduced(case: VerifyCase) -> VerifyCase:
    """``case`` where its float64 reference fits the budget, else its reduced twin: the sequence
    and every length of the configuration divided by the smallest power of two that brings the
    reference under the budget. Dividing both keeps each segment's relation to the sequence and
    to a rank's shard, so K/V that crosses ranks in the configuration still crosses them in the
    twin. Where the implementation cannot scale (or only part way) the closest case is returned."""
    if reference_bytes(case) <= REFERENCE_BUDGET_BYTES:
        return case
    impl = impls.build_for_ranks(case.impl, case.config, case.world_size)
    found, factor = case, 2
    while case.seq_len % factor == 0 and reference_bytes(found) > REFERENCE_BUDGET_BYTES:
        config = impl.scaled_config(factor)  # None: not at this factor (a Hilbert grid takes powers of 4)
        twin = _twin(case, config, factor) if config is not None else None
        found = twin or found
        factor *= 2
    return found


def _twin(case: VerifyCase, config: dict[str, Any], factor: int) -> VerifyCase | None:
    """The case at 1/``factor`` of its length with ``config``, or None where that shape is refused."""
    from attnbench.errors import ConfigError

    twin = replace(case, config=config, seq_len=case.seq_len // factor, twin_of=case.config, twin_scale=factor)
    try:
        impls.build_for_ranks(case.impl, config, case.world_size).check_shape(twin.seq_len, case.heads)
    except ConfigError:
        return None
    return twin


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.detach().to("cpu", torch.float64)
    if not torch.isfinite(out).all():
        return float("nan")
    denom = torch.linalg.vector_norm(ref)
    err = torch.linalg.vector_norm(out - ref)
    return float(err / denom) if denom > 0 else float(err)


# The fields of a case every verify row holds (its other workload fields only where they apply).
ROW_WORKLOAD = ("impl", "config", "batch", "seq_len", "heads", "head_dim", "causal", "dtype", "device", "world_size")


@dataclass(frozen=True)
class VerifyCase:
    impl: str
    config: dict[str, Any]
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    causal: bool
    dtype: str
    device: str
    world_size: int = 1  # ranks a sequence-parallel implementation runs on
    mode: str = "fwd"  # fwd_bwd: dq, dk, dv are checked too
    kv_heads: int | None = None  # key/value heads shared by groups of query heads (None: heads)
    twin_of: dict[str, Any] | None = None  # a reduced twin: the configuration it stands for
    twin_scale: int = 1  # a reduced twin: lengths are those of ``twin_of`` divided by this

    def check(self, seed: int, status: str, message: str, **found: Any) -> Check:
        """What a check of this case on inputs of ``seed`` found (``found``: its errors, backend, K/V
        layout), with the tolerances it was held to and, for a reduced twin, the configuration it
        stands for and the scale."""
        return Check(
            status=status,
            message=message,
            seed=seed,
            tolerance=TOLERANCE[self.dtype],
            grad_tolerance=GRAD_TOLERANCE[self.dtype] if self.mode == "fwd_bwd" else None,
            twin_of=self.twin_of,
            twin_scale=self.twin_scale if self.twin_of is not None else None,
            **found,
        )

    def row(self, check: Check, run: str, env: Environment | None, strategy: str | None = None) -> Verify:
        """This case's verify row: its workload beside what ``check`` found (``strategy``: how ranks
        share the sequence). The mode is written only where gradients were checked and key/value
        heads only where fewer than the heads, so other rows keep the keys they had before either."""
        shape = {name: getattr(self, name) for name in ROW_WORKLOAD}
        optional = {
            "mode": self.mode if self.mode == "fwd_bwd" else None,
            "kv_heads": self.kv_heads if self.kv_heads != self.heads else None,
            "strategy": strategy,
            "impl_source": impls.recorded_source(self.impl),
        }
        written = {name: value for name, value in optional.items() if value is not None}
        return join(Verify, check, kind="verify", run=run, env=env, **shape, **written)

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(q and the output, k and v): ``(B, N, H, D)`` and ``(B, N, H_kv, D)``."""
        q = (self.batch, self.seq_len, self.heads, self.head_dim)
        return q, (*q[:2], self.kv_heads or self.heads, self.head_dim)


# (batch, heads, key/value heads, head dim) of the checks at a configuration's verify length
# (the second at twice it): B > 1, head counts that do not divide evenly into head groups,
# and 8 query heads over 2 key/value heads, whose groups of 4 cut across head groups of 3
VERIFY_SHAPES = ((2, 5, None, 16), (1, 3, None, 32), (2, 8, 2, 16))
# `attnbench verify` without --full: the one shape that holds most of them (B > 1, grouped heads)
QUICK_SHAPE = (2, 8, 2, 16)


@dataclass(frozen=True)
class Shapes:
    """Which shapes `attnbench verify` checks: the full matrix (``VERIFY_SHAPES``, every
    verify configuration), or one shape per configuration; lengths, heads, key/value heads
    and head dim where the command names them."""

    full: bool = True
    seq_lens: tuple[int, ...] = ()  # empty: the implementation's verify length
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None

    def at(self, n: int) -> list[tuple[int, int, int, int | None, int]]:
        """(batch, length, heads, key/value heads, head dim) of the checks for verify length ``n``."""
        if self.full and not self.named:
            shapes = [(b, n * (2 if i == 1 else 1), h, kv, d) for i, (b, h, kv, d) in enumerate(VERIFY_SHAPES)]
        else:
            b, h, kv, d = QUICK_SHAPE
            if self.heads is not None or self.kv_heads is not None:
                h, kv = self.heads or h, self.kv_heads
            shapes = [(b, n, h, kv, self.head_dim or d)]
        if not self.seq_lens:
            return shapes
        return [(b, length, h, kv, d) for length in self.seq_lens for b, _, h, kv, d in shapes[:1]]

    @property
    def named(self) -> bool:
        return any(x is not None for x in (self.heads, self.kv_heads, self.head_dim))


def verify_shapes(n: int) -> list[tuple[int, int, int, int | None, int]]:
    """(batch, length, heads, key/value heads, head dim) of the full checks for verify length ``n``."""
    return Shapes().at(n)


def default_cases(
    name: str,
    device: str,
    dtypes: list[str],
    mode: str = "fwd",
    configs=None,
    world: int = 1,
    shapes: Shapes | None = None,
) -> list[VerifyCase]:
    """Small shapes per configuration (``configs``, default the implementation's verify
    configurations; without ``shapes.full`` the first): ``shapes`` (default the full matrix,
    ``VERIFY_SHAPES``), causal where it means something; ``mode`` fwd_bwd checks dq, dk, dv
    too; a sequence-parallel implementation runs on ``world`` ranks."""
    shapes = shapes or Shapes()
    entry = impls.spec(name)
    if configs is None:
        configs = entry.verify_configs(device) if callable(entry.verify_configs) else entry.verify_configs
        configs = configs if shapes.full else configs[:1]
    cases = []
    for config in configs:
        impl = impls.build_for_ranks(name, config, world)  # its shape rules depend on the ranks
        for batch, seq_len, heads, kv_heads, head_dim in shapes.at(impl.verify_seq_len()):
            if shapes.seq_lens:  # a length the command names: one this configuration takes
                _check_named(impl, seq_len, heads)
            for causal in (False, True) if impl.supports_causal else (False,):
                cases += [
                    VerifyCase(
                        name,
                        impl.config(),
                        batch,
                        seq_len,
                        heads,
                        head_dim,
                        causal,
                        dtype,
                        device,
                        world,
                        mode,
                        kv_heads,
                    )
                    for dtype in dtypes
                ]
    return cases


def _check_named(impl, seq_len: int, heads: int) -> None:
    from attnbench.errors import ConfigError

    try:
        impl.check_shape(seq_len, heads)
    except ConfigError as exc:
        raise AttnbenchError(f"verify --seq-len {seq_len}: {exc}") from None


# --- a long check: where a sparse pattern is sparse --------------------------------------

# The float64 reference a long check may cost in arithmetic, 4 B H N^2 D (seconds on a CPU),
# besides its memory (REFERENCE_BUDGET_BYTES a few heads at a time).
REFERENCE_FLOPS_BUDGET = 8e9
# A length where the key sets hold under this share of the pairs checks a pattern as sparse.
SPARSE_SHARE = 0.5
# Where a pattern is asked whether it is sparse at all, beyond any check's reach.
FAR_LENGTH = 1 << 20


def affordable(batch: int, heads: int, head_dim: int, n: int, memory_limit: int | None = None) -> bool:
    """Whether the float64 reference at this shape fits its budgets (memory a head at a time,
    a share of ``memory_limit`` where the checks run under one)."""
    memory = REFERENCE_BUDGET_BYTES
    if memory_limit is not None:
        memory = min(memory, LONG_CHECK_MEMORY_SHARE * memory_limit)
    return 24 * batch * n * n <= memory and 4 * batch * heads * n * n * head_dim <= REFERENCE_FLOPS_BUDGET


@dataclass(frozen=True)
class LongCheck:
    """A configuration's check beyond its short lengths: the length (None: none is needed, or
    none fits the budget), the share of the pairs its key sets hold at each length looked at,
    and a warning where every checked length is dense but the pattern is not."""

    seq_len: int | None
    shares: list[tuple[int, float]]
    warning: str | None = None


def _share(impl, n: int, heads: int) -> float:
    return impl.useful_pairs(n, heads, False) / (heads * n * n)


def long_check(impl, base: int, batch: int, heads: int, head_dim: int, memory_limit: int | None = None) -> LongCheck:
    """Where ``impl``'s key sets hold under half the pairs, the shortest length from ``base``
    doubling at which they do; where they never do within the reference's budget, the longest
    length it affords (a window wider than declared, or declared dense, shows there) and a
    warning when the pattern is sparse further on."""
    shares = [(base, _share(impl, base, heads))]
    if shares[0][1] < SPARSE_SHARE:
        return LongCheck(None, shares)
    n, longest = 2 * base, None
    while affordable(batch, heads, head_dim, n, memory_limit) and _accepts(impl, n, heads):
        shares.append((n, _share(impl, n, heads)))
        if shares[-1][1] < SPARSE_SHARE:
            return LongCheck(n, shares)
        longest, n = n, 2 * n
    far = _far_share(impl, heads)
    declared_sparse = far is not None and far < SPARSE_SHARE
    unknown = far is None and getattr(impl, "declares", "dense") != "dense"
    if not (declared_sparse or unknown):
        return LongCheck(longest, shares)
    looked = ", ".join(f"{m}: {share:.0%}" for m, share in shares)
    further = f"at {FAR_LENGTH:,} they hold {far:.1%}" if declared_sparse else "they are not counted further"
    warning = (
        f"{impl.name} {_config_text(impl.config())}: its declared key sets hold at least half the pairs at every "
        f"length the reference check affords (N {looked}) and {further}: a key set wider than declared would "
        "pass; check a longer length with `attnbench verify --seq-len N`"
    )
    return LongCheck(longest, shares, warning)


def _config_text(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items())) or "(defaults)"


def _accepts(impl, n: int, heads: int) -> bool:
    from attnbench.errors import ConfigError

    try:
        impl.check_shape(n, heads)
    except ConfigError:
        return False
    return True


def _far_share(impl, heads: int) -> float | None:
    """The share of the pairs the key sets hold at FAR_LENGTH (on the implementation's grid), or
    None where they cannot be counted there."""
    from attnbench.errors import ConfigError
    from attnbench.masks.mask_mod import CountRefused

    n = -(-FAR_LENGTH // impl.granularity) * impl.granularity
    try:
        impl.check_shape(n, heads)
        return _share(impl, n, heads)
    except (ConfigError, CountRefused, NotImplementedError):
        return None


@dataclass
class LongCheckRequests:
    requests: list[dict[str, Any]]  # impl, config, base, batch, heads, head_dim, memory_limit


@dataclass
class LongChecks:
    checks: list[LongCheck]  # one per request, in order


@job
def long_check_job(spec: LongCheckRequests) -> LongChecks:
    """Worker side of ``long_checks`` for outside code."""
    return LongChecks([_long_check_here(r) for r in spec.requests])


def _long_check_here(r: dict[str, Any]) -> LongCheck:
    """The request's long check; where its key sets cannot be read, none (the reference check
    itself then says what fails) and a warning naming why."""
    try:
        impl = impls.build(r["impl"], **r["config"])
        return long_check(impl, r["base"], r["batch"], r["heads"], r["head_dim"], r.get("memory_limit"))
    except Exception as exc:  # the user's declaration failed: reported by the check, named here
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return LongCheck(None, [], f"{r['impl']}: no long check, its key sets could not be counted ({why})")


def long_checks(requests: list[dict[str, Any]]) -> list[LongCheck]:
    """``long_check`` of each request (impl, config, base, batch, heads, head_dim); outside code's in
    one worker process, the rest here."""
    from attnbench.runtime.worker import run_in_child
    from attnbench.trials.supervised import import_limit_s

    away = [r for r in requests if impls.outside_code_elsewhere(r["impl"], r["config"])]
    found: dict[int, LongCheck] = {id(r): _long_check_here(r) for r in requests if r not in away}
    if away:
        ran = run_in_child(long_check_job, LongCheckRequests(away), import_limit_s())
        if ran.result is None:
            raise AttnbenchError(
                f"{', '.join(dict.fromkeys(r['impl'] for r in away))}: the key sets could not be read to choose "
                f"the check's lengths ({ran.ended.status}: {ran.ended.message})"
            )
        for r, check in zip(away, ran.result.checks):
            found[id(r)] = check
    return [found[id(r)] for r in requests]


def with_long_checks(cases: list[VerifyCase], memory_limit: int | None = None) -> tuple[list[VerifyCase], list[str]]:
    """``cases`` and, per one-device configuration and head layout, one check at a length where
    its declared key sets hold under half the pairs (or the longest the reference affords, under
    ``memory_limit`` where the checks run under one): batch 1, the configuration's heads,
    key/value heads and head dim, its first dtype; and the warnings of configurations dense at
    every length checked."""
    groups: dict[str, list[VerifyCase]] = {}
    for c in cases:
        if c.world_size == 1 and not impls.spec(c.impl).distributed and c.twin_of is None:
            key = json.dumps([c.impl, c.config, c.heads, c.kv_heads, c.head_dim, c.device], sort_keys=True)
            groups.setdefault(key, []).append(c)
    firsts = [group[0] for group in groups.values()]
    requests = [
        {
            "impl": c.impl,
            "config": c.config,
            "base": max(x.seq_len for x in group),
            "batch": 1,
            "heads": c.heads,
            "head_dim": c.head_dim,
            "memory_limit": memory_limit,
        }
        for c, group in zip(firsts, groups.values())
    ]
    extra, warnings = [], []
    for c, group, check in zip(firsts, groups.values(), long_checks(requests)):
        if check.warning:
            warnings.append(check.warning)
        if check.seq_len and check.seq_len > max(x.seq_len for x in group):
            causal = all(x.causal for x in group)
            extra.append(replace(c, batch=1, seq_len=check.seq_len, causal=causal, mode="fwd"))
    return cases + extra, warnings


def _no_phase(name: str) -> None:
    pass


def run_case(case: VerifyCase, seed: int | None = None, phase: Callable[[str], None] = _no_phase) -> Check:
    """Run one case on fresh random inputs; what the check found, with the seconds it took.
    ``phase`` hears "verify-call" before the implementation is built and called (its code: a
    supervising worker holds it to a call's limit) and "reference" before the float64
    reference (attnbench's own arithmetic)."""
    started = time.monotonic()
    check = _check_case(case, seed, phase)
    return replace(check, elapsed_s=round(time.monotonic() - started, 3))


def _check_case(case: VerifyCase, seed: int | None, phase: Callable[[str], None]) -> Check:
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    q_shape, kv_shape = case.shapes()
    # Round the inputs to the dtype first so the reference sees exactly what the impl sees.
    q, k, v = (
        torch.randn(shape, generator=gen, dtype=torch.float64).to(torch_dtype(case.dtype))
        for shape in (q_shape, kv_shape, kv_shape)
    )
    phase("verify-call")
    impl = impls.build(case.impl, **case.config)
    if case.mode == "fwd_bwd":
        return _check_gradients(impl, case, seed, q, k, v, gen, phase)
    try:
        with torch.no_grad():
            out = impl(q.to(case.device), k.to(case.device), v.to(case.device), is_causal=case.causal)
    except Exception as exc:  # a case that cannot run is reported, never raised
        return case.check(seed, *_failed(exc))
    phase("reference")
    if not isinstance(out, torch.Tensor) or out.shape != q.shape:
        if not isinstance(out, torch.Tensor):
            return case.check(seed, "error", f"output is a {type(out).__name__}, not a (B, N, H, D) tensor")
        return case.check(seed, "error", diagnose.shape_hint(tuple(out.shape), tuple(q.shape)))
    mask = impl.key_mask(case.seq_len, case.heads, causal=case.causal)
    ref = masked_reference(q, k, v, mask, gqa_mapping=impl.gqa_mapping, device=case.device)
    err = relative_error(out, ref)
    ok = err == err and err <= TOLERANCE[case.dtype]
    message = "" if ok else ("non-finite output" if err != err else "relative error above tolerance")
    if not ok:
        message += "".join(
            f"; {line}" for line in diagnose.mismatch(out, ref, q, k, v, mask, masked_reference, impl.gqa_mapping)
        )
    status = "pass" if ok else "fail"
    return case.check(seed, status, message, rel_err=err, backend=impl.last_backend, kv_layout=_kv_layout(impl))


def _failed(exc: BaseException) -> tuple[str, str]:
    """The status and message of a case that raised: ``unsupported`` where the kernel has no
    such shape (not a wrong output), else ``error``; the message's first line."""
    status = "unsupported" if classify(exc) == "unsupported" else "error"
    return status, f"{type(exc).__name__}: {exc}".splitlines()[0]


def _kv_layout(impl) -> str | None:
    """Grouped K/V: shared or expanded; None where the call had no groups."""
    return getattr(impl, "last_kv_layout", None) or None


def _check_gradients(impl, case: VerifyCase, seed: int, q, k, v, gen: torch.Generator, phase=_no_phase) -> Check:
    """Forward and backward on the device against the float64 reference's output and its
    dq, dk, dv for one random output gradient (rounded to the dtype, like the inputs)."""
    grad_out = torch.randn(q.shape, generator=gen, dtype=torch.float64).to(q.dtype)
    try:
        inputs = [x.to(case.device).requires_grad_(True) for x in (q, k, v)]
        out = impl(*inputs, is_causal=case.causal)
        grads = torch.autograd.grad(out, inputs, grad_out.to(case.device), allow_unused=True)
        grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]  # unreached: zero
    except Exception as exc:  # a case that cannot run is reported, never raised
        return case.check(seed, *_failed(exc))
    phase("reference")
    ref_inputs = [x.to(torch.float64).requires_grad_(True) for x in (q, k, v)]
    mask = impl.key_mask(case.seq_len, case.heads, causal=case.causal)
    ref = masked_attention(*ref_inputs, mask, gqa_mapping=impl.gqa_mapping)
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad_out.to(torch.float64))
    errors = {"rel_err": relative_error(out, ref.detach())}
    errors |= {f"rel_err_{name}": relative_error(got, want) for name, got, want in zip(GRADIENTS, grads, ref_grads)}
    limits = [TOLERANCE[case.dtype], *[GRAD_TOLERANCE[case.dtype]] * len(GRADIENTS)]
    checked = zip(("out", *GRADIENTS), errors.values(), limits)
    bad = [name for name, err, limit in checked if not err <= limit]  # NaN fails
    message = "" if not bad else "relative error above tolerance: " + ", ".join(bad)
    status = "fail" if bad else "pass"
    return case.check(seed, status, message, backend=impl.last_backend, kv_layout=_kv_layout(impl), **errors)
