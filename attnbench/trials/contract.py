"""The implementation contract, checked: one line per violation.

``attnbench verify`` runs these before the reference cases on every implementation named by
import path or entry point: a built-in meets them by construction, an outside one is the
user's code meeting them for the first time. Checked on fresh random inputs at a small shape:

- the output is a tensor of the inputs' shape ``(B, N, H, D)`` and dtype;
- the output matches the float64 reference over the declared key sets (mask_mod, key_mask
  or dense) without and with ``is_causal``, and ``is_causal=True`` changes the output where
  it changes the key sets;
- pairs given in closed form equal the pairs of the declared key sets;
- two calls on the same inputs agree within the dtype's tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnbench import impls
from attnbench.trials import diagnose
from attnbench.trials.reference import TOLERANCE, masked_reference, relative_error
from attnbench.trials.workload import torch_dtype

SHAPE = (2, 3, 16)  # batch, heads, head dim; the length is the implementation's verify length


def _no_phase(name: str) -> None:
    pass


def violations(
    name: str, config: dict[str, Any], device: str, dtype: str, seed: int = 0, phase: Callable[[str], None] = _no_phase
) -> list[str]:
    """Every way ``name`` (built with ``config``) breaks the contract; empty when it holds.
    ``phase`` hears "verify-call" before its code runs and "reference" before the float64
    reference, as ``reference.run_case`` says them."""
    phase("verify-call")
    impl = impls.build(name, **config)
    batch, heads, head_dim = SHAPE
    n = impl.verify_seq_len()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(batch, n, heads, head_dim, generator=gen, dtype=torch.float64).to(torch_dtype(dtype))
        for _ in range(3)
    )
    tol = TOLERANCE[dtype]
    found: list[str] = []
    outputs = {}
    for causal in (False, True) if impl.supports_causal else (False,):
        phase("verify-call")
        out, problem = _call(impl, q, k, v, causal, device)
        if problem:
            found.append(problem)
            break  # the same fault again with is_causal=True says nothing new
        outputs[causal] = out
        phase("reference")
        declared = impl.key_mask(n, heads, causal=causal)
        ref = masked_reference(q, k, v, declared)
        err = relative_error(out, ref)
        if not err <= tol:
            why = "".join(f"; {line}" for line in diagnose.mismatch(out, ref, q, k, v, declared, masked_reference))
            found.append(
                f"output{' with is_causal=True' if causal else ''} disagrees with the declared key sets "
                f"({_declared(impl)}): relative error {err:.2e} > {tol:.0e}{why}; declare the keys forward "
                "really uses or fix forward"
            )
        pairs = impl.useful_pairs(n, heads, causal)
        if pairs != int(declared.sum()):
            found.append(
                f"useful_pairs({n}, {heads}, causal={causal}) = {pairs} but the declared key sets hold "
                f"{int(declared.sum())} pairs; fix useful_pairs or drop it (pairs are then counted)"
            )
    if False in outputs and True in outputs:
        changes_sets = not torch.equal(impl.key_mask(n, heads, causal=False), impl.key_mask(n, heads, causal=True))
        if changes_sets and relative_error(outputs[True], outputs[False].to(torch.float64)) <= tol:
            found.append(
                "is_causal=True is ignored: the output equals the non-causal one; apply kv_idx <= q_idx "
                "when is_causal is set"
            )
    if False in outputs:
        phase("verify-call")
        again, problem = _call(impl, q, k, v, False, device)
        if not problem:
            drift = relative_error(again, outputs[False].to(torch.float64))
            if not drift <= tol:
                found.append(f"not deterministic: two calls on the same inputs differ by {drift:.2e} > {tol:.0e}")
    return found


def _call(impl, q, k, v, causal: bool, device: str) -> tuple[torch.Tensor | None, str | None]:
    """(output, None), or (None, the violation) when the call fails or returns the wrong thing."""
    try:
        with torch.no_grad():
            out = impl(q.to(device), k.to(device), v.to(device), is_causal=causal)
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return None, f"forward(q, k, v, is_causal={causal}) raised {first}"
    if not isinstance(out, torch.Tensor):
        return None, f"forward returned a {type(out).__name__}, not a tensor: return the (B, N, H, D) output"
    if tuple(out.shape) != tuple(q.shape):
        return None, diagnose.shape_hint(tuple(out.shape), tuple(q.shape))
    if out.dtype != q.dtype:
        return None, f"output dtype {out.dtype} is not the input's {q.dtype}; return the inputs' dtype"
    return out, None


def _declared(impl) -> str:
    return getattr(impl, "declares", "declared by the implementation")
