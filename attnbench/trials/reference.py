"""The float64 dense masked reference, and verification of any registered implementation.

Every implementation is defined by its declared key sets (docs/design/semantics.md), so one reference
checks them all: build the boolean (H, N, N) mask at small N, run masked softmax attention in
float64 on the CPU, and compare with ||out - ref|| / ||ref||. With grouped heads (fewer
key/value heads than query heads) the reference reads, for query head h, key/value head
h // (H / H_kv), written out here on its own rather than taken from any implementation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnbench import impls
from attnbench.measure.oom import classify
from attnbench.results.schema import Check, Verify, join
from attnbench.trials.workload import torch_dtype

# Relative-error tolerance per dtype: float32 arithmetic lands far below 1e-4; 16-bit inputs
# and outputs with float32 accumulation land at a few times their unit roundoff.
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3, "bf16": 1e-2}
# Gradients (fwd_bwd): the backward reads the rounded output and rounds each gradient once
# more after long float32 sums, so a few times the output's tolerance.
GRAD_TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 3e-2}
GRADIENTS = ("dq", "dk", "dv")


def masked_reference(q, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """out[b,t,h] = sum_u softmax_u over M_h(t) of q.k * scale, times v; empty sets give 0."""
    q, k, v = (x.detach().to("cpu", torch.float64) for x in (q, k, v))
    return masked_attention(q, k, v, mask, scale)


def masked_attention(q, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """``masked_reference``'s arithmetic in the inputs' dtype and device, differentiable: an
    empty key set's row and its gradients are zero. k, v with fewer heads than q serve groups
    of consecutive query heads (their gradients sum over the group)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if k.shape[2] != q.shape[2]:
        group = q.shape[2] // k.shape[2]
        k, v = (torch.repeat_interleave(x, group, dim=2) for x in (k, v))
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

    def row(self, check: Check, run: str, env: dict[str, Any] | None, strategy: str | None = None) -> Verify:
        """This case's verify row: its workload beside what ``check`` found (``strategy``: how ranks
        share the sequence). The mode is written only where gradients were checked and key/value
        heads only where fewer than the heads, so other rows keep the keys they had before either."""
        shape = {name: getattr(self, name) for name in ROW_WORKLOAD}
        optional = {
            "mode": self.mode if self.mode == "fwd_bwd" else None,
            "kv_heads": self.kv_heads if self.kv_heads != self.heads else None,
            "strategy": strategy,
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


def verify_shapes(n: int) -> list[tuple[int, int, int, int | None, int]]:
    """(batch, length, heads, key/value heads, head dim) of the checks for verify length ``n``."""
    return [(b, n * (2 if i == 1 else 1), h, kv, d) for i, (b, h, kv, d) in enumerate(VERIFY_SHAPES)]


def default_cases(
    name: str, device: str, dtypes: list[str], mode: str = "fwd", configs=None, world: int = 1
) -> list[VerifyCase]:
    """Several small shapes per configuration (``configs``, default the implementation's
    verify configurations): ``VERIFY_SHAPES``, causal where it means something; ``mode``
    fwd_bwd checks dq, dk, dv too; a sequence-parallel implementation runs on ``world`` ranks."""
    entry = impls.spec(name)
    if configs is None:
        configs = entry.verify_configs(device) if callable(entry.verify_configs) else entry.verify_configs
    cases = []
    for config in configs:
        impl = impls.build_for_ranks(name, config, world)  # its shape rules depend on the ranks
        for batch, seq_len, heads, kv_heads, head_dim in verify_shapes(impl.verify_seq_len()):
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
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return case.check(seed, "error", f"output {got} is not (B, N, H, D) {tuple(q.shape)}")
    ref = masked_reference(q, k, v, impl.key_mask(case.seq_len, case.heads, causal=case.causal))
    err = relative_error(out, ref)
    ok = err == err and err <= TOLERANCE[case.dtype]
    message = "" if ok else ("non-finite output" if err != err else "relative error above tolerance")
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
    ref = masked_attention(*ref_inputs, impl.key_mask(case.seq_len, case.heads, causal=case.causal))
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad_out.to(torch.float64))
    errors = {"rel_err": relative_error(out, ref.detach())}
    errors |= {f"rel_err_{name}": relative_error(got, want) for name, got, want in zip(GRADIENTS, grads, ref_grads)}
    limits = [TOLERANCE[case.dtype], *[GRAD_TOLERANCE[case.dtype]] * len(GRADIENTS)]
    checked = zip(("out", *GRADIENTS), errors.values(), limits)
    bad = [name for name, err, limit in checked if not err <= limit]  # NaN fails
    message = "" if not bad else "relative error above tolerance: " + ", ".join(bad)
    status = "fail" if bad else "pass"
    return case.check(seed, status, message, backend=impl.last_backend, kv_layout=_kv_layout(impl), **errors)
