"""Grouped-query attention (GQA): ``H`` query heads share the keys and values of ``H_kv``
heads, ``H`` a multiple of ``H_kv``; query head ``h`` reads key/value head ``h // (H / H_kv)``
(contiguous groups, the layout of ``torch.nn.functional.scaled_dot_product_attention`` with
``enable_gqa``). ``H_kv = 1`` is multi-query attention; ``H_kv = H`` is plain multi-head.

What the implementations share to run it: the shape rule checked on every call
(``check_inputs``), SDPA called with ``enable_gqa`` exactly where the heads differ (``sdpa``),
and the copy of K and V to every query head for a kernel that cannot share them
(``expand_kv``); a result row says which happened (``SHARED``, ``EXPANDED``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.errors import ConfigError

#: K and V read once per group of query heads (no copy)
SHARED = "shared"
#: K and V copied to every query head before the kernel (the copy costs memory and time)
EXPANDED = "expanded"


class NoGroupedKernel(NotImplementedError):
    """The kernel asked for has no grouped-query variant: the shape is not supported (a
    trial reports it as ``unsupported``, not as an error)."""


def group_size(num_heads: int, kv_heads: int) -> int:
    """Query heads per key/value head; ConfigError naming the rule when they do not divide."""
    if kv_heads <= 0 or num_heads % kv_heads:
        raise ConfigError(
            f"{num_heads} query heads cannot share {kv_heads} key/value heads: query heads share "
            "key/value heads in equal groups, so the key/value heads must divide the query heads"
        )
    return num_heads // kv_heads


def check_inputs(q, k, v) -> int:
    """q ``(B, N, H, D)``, k and v ``(B, N, H_kv, D)`` with H a multiple of H_kv: else a
    ConfigError saying which dimension disagrees (an implementation never guesses). Returns
    the group size."""
    if not all(isinstance(x, torch.Tensor) and x.dim() == 4 for x in (q, k, v)):
        raise ConfigError("attention takes q, k, v as (batch, tokens, heads, head dim) tensors")
    if k.shape != v.shape:
        raise ConfigError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ: they must have one shape")
    for dim, what in ((0, "batch"), (1, "tokens"), (3, "head dim")):
        if q.shape[dim] != k.shape[dim]:
            raise ConfigError(f"q has {q.shape[dim]} in its {what} dimension but k and v have {k.shape[dim]}")
    return group_size(q.shape[2], k.shape[2])


def heads_differ(q: torch.Tensor, k: torch.Tensor, dim: int) -> bool:
    return q.shape[dim] != k.shape[dim]


def expand_kv(x: torch.Tensor, groups: int, dim: int) -> torch.Tensor:
    """Each key/value head repeated for the ``groups`` query heads that read it (a copy)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)


def expanded_for(impl, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """``k, v`` as an implementation without grouped heads takes them: copied to every query
    head where their heads differ (the row then says ``expanded``), else as they are."""
    if not heads_differ(q, k, 2):
        return k, v
    groups = q.shape[2] // k.shape[2]
    impl.last_kv_layout = EXPANDED
    return expand_kv(k, groups, 2), expand_kv(v, groups, 2)


def sdpa(q, k, v, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on ``(B, H, N, D)`` views, sharing K and V where
    they have fewer heads than q (``enable_gqa`` only then: with equal heads every backend
    stays available, as before grouped heads existed)."""
    if heads_differ(q, k, 1):
        kwargs["enable_gqa"] = True
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def layout(q: torch.Tensor, k: torch.Tensor, expanded: bool, dim: int = 2) -> str | None:
    """What a row records: None without grouped heads, else SHARED or EXPANDED."""
    if not heads_differ(q, k, dim):
        return None
    return EXPANDED if expanded else SHARED
