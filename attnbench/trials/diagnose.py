"""Why an output disagrees with the float64 reference, in short clauses a failed check carries.

A wrong window, a head never written, a rescaled output, grouped K/V heads read in the other
order and rows dropped all give a large relative error; these tell them apart from the
output and reference themselves: the error per head, heads or query rows that are all zero,
the ratio of the output's scale to the reference's, whether the other grouped-head convention
would match, and a shape hint computed from the shapes the call really returned.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# A part of the output this close to the reference counts as matching (a probe's verdict).
MATCH = 1e-3
# Heads listed by name before the rest are counted.
SHOWN = 8


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    denom = torch.linalg.vector_norm(b)
    err = torch.linalg.vector_norm(a - b)
    return float(err / denom) if denom > 0 else float(err)


def mismatch(
    out, ref, q, k, v, mask, reference: Callable[..., torch.Tensor], gqa_mapping: str = "consecutive"
) -> list[str]:
    """Clauses on a (B, N, H, D) output that disagrees with its (B, N, H, D) float64 reference
    (``reference``: the reference's function, asked again under the other grouped-head mapping)."""
    out = out.detach().to("cpu", torch.float64)
    if not torch.isfinite(out).all():
        bad = (~torch.isfinite(out)).any(dim=(0, 1, 3)).nonzero().flatten().tolist()
        return [f"non-finite values in heads {_names(bad)}"]
    lines = [_per_head(out, ref)]
    lines += _zeros(out, ref)
    lines += _scale(out, ref)
    if k.shape[2] != q.shape[2]:
        other = "interleaved" if gqa_mapping == "consecutive" else "consecutive"
        if _rel(out, reference(q, k, v, mask, gqa_mapping=other)) <= MATCH:
            rule = "j % H_kv" if other == "interleaved" else "j // (H / H_kv)"
            lines.append(
                f"the output matches query head j reading K/V head {rule}: declare gqa_mapping = {other!r} "
                f"(attnbench checked {gqa_mapping!r})"
            )
    return [line for line in lines if line]


def _per_head(out: torch.Tensor, ref: torch.Tensor) -> str:
    errors = [_rel(out[:, :, h], ref[:, :, h]) for h in range(out.shape[2])]
    if len(errors) <= SHOWN:
        return "error per head " + ", ".join(f"{h}: {e:.1e}" for h, e in enumerate(errors))
    worst = sorted(range(len(errors)), key=lambda h: -errors[h])[:SHOWN]
    return f"worst heads of {len(errors)}: " + ", ".join(f"{h}: {errors[h]:.1e}" for h in worst)


def _zeros(out: torch.Tensor, ref: torch.Tensor) -> list[str]:
    """Heads, then query rows, that are all zero where the reference is not."""
    lines = []
    zero_heads = [h for h in range(out.shape[2]) if not out[:, :, h].any() and ref[:, :, h].any()]
    if zero_heads:
        lines.append(f"heads {_names(zero_heads)} are all zero (never written?)")
    rows = (~out.any(dim=-1)) & ref.any(dim=-1)  # (B, N, H)
    for h in zero_heads:
        rows[:, :, h] = False
    if rows.any():
        n = int(rows.any(dim=(0, 2)).sum())
        first = int(rows.any(dim=(0, 2)).nonzero()[0])
        lines.append(f"{n} of {out.shape[1]} query rows are all zero in some head (the first at t={first})")
    return lines


def _scale(out: torch.Tensor, ref: torch.Tensor) -> list[str]:
    """The output's scale against the reference's, and whether a scalar explains the difference."""
    ref_norm = float(torch.linalg.vector_norm(ref))
    if ref_norm == 0:
        return []
    ratio = float(torch.linalg.vector_norm(out)) / ref_norm
    fit = float((out * ref).sum()) / ref_norm**2  # the best scalar multiple of the reference
    if fit and _rel(out, fit * ref) <= MATCH and abs(fit - 1) > MATCH:
        return [f"the output is the reference times {fit:.4g}: a rescaled output (softmax scale, a missing 1/sum?)"]
    return [f"output/reference scale {ratio:.3g}"] if abs(ratio - 1) > 0.01 else []


def _names(heads: list[int]) -> str:
    shown = ", ".join(map(str, heads[:SHOWN]))
    return shown + (f" and {len(heads) - SHOWN} more" if len(heads) > SHOWN else "")


def shape_hint(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """What an output of shape ``got`` did, where (B, N, H, D) ``want`` was due."""
    b, n, h, d = want
    text = f"output shape {got} is not the input's (B, N, H, D) = {want}"
    if got == (b, h, n, d) and n != h:
        return f"{text}: it is (B, H, N, D); return out.transpose(1, 2)"
    if len(got) == 3 and got == (b, n, h * d):
        return f"{text}: its heads are merged (B, N, H*D); return out.view(B, N, H, D)"
    if len(got) == 4 and (got[0], got[2], got[3]) == (b, h, d) and got[1] != n:
        what = "dropped" if got[1] < n else "added"
        return f"{text}: it has {got[1]} query rows for {n} queries ({abs(n - got[1])} {what})"
    if len(got) == 4 and got[:3] == (b, n, h) and got[3] != d:
        return f"{text}: head dim {got[3]} where the values have {d}"
    if len(got) == 4 and (got[0], got[1], got[3]) == (b, n, d) and got[2] != h:
        return f"{text}: {got[2]} heads for {h} query heads (grouped K/V heads returned as they came?)"
    return text
