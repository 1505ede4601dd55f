"""FlexAttention as the block-sparse implementations call it: one compiled ``flex_attention``
per compile mode (``compiled_flex``), its kernel options and backward tiles for blocks under
128 tokens (``flex_options``, ``backward_tiles``, ``parse_kernel_options``), the compile mode
a training call needs (``flex_compile_mode``), the call itself with the 32-bit offset guard
and the log-sum-exp request (``flex_attend``), the causal mask of a diagonal block
(``diagonal_causal``) and what this torch's FlexAttention takes (``has_compute_q_blocks``,
``compact_indices_ok``). Used by ``block-sparse`` and ``block-sparse-ring``."""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import torch

from attnbench.errors import ConfigError

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import AuxRequest

#: FlexAttention's ``kernel_options``: tile sizes, warps, stages, flags, by Triton's names
KernelOptions = dict[str, int | float | bool | str]

# torch 2.11's FlexAttention kernel computes element offsets in 32 bits: past this a token's
# offset wraps and the output is silently wrong (flex vs the exact gather path on an H200);
# flex_attend runs per (batch, head) there
FLEX_MAX_OFFSET = 1 << 31


def backward_tiles(block_size: int) -> dict[str, int]:
    """FlexAttention backward tiles for sparse blocks under 128 tokens: every tile divides the
    block, and the kernel's static assertions hold (BLOCK_N1 a multiple of BLOCK_M1, BLOCK_M2 a
    multiple of BLOCK_N2). 64 -> (32, 64, 64, 32), 32 -> (16, 32, 32, 16), 16 -> all 16."""
    big = min(64, block_size)
    small = max(16, big // 2)
    return {"BLOCK_M1": small, "BLOCK_N1": big, "BLOCK_M2": big, "BLOCK_N2": small}


def flex_options(
    q, block_size: int, user: KernelOptions, contiguous_blocks: bool = False, grad: bool = False
) -> KernelOptions | None:
    options = dict(user)
    if q.is_cuda and block_size < 128:
        # the default Triton tiles are 128 wide on recent GPUs; a sparse block must hold whole tiles
        options.setdefault("BLOCK_M", block_size)
        options.setdefault("BLOCK_N", block_size)
        if grad:  # the backward reads its own tile names, not BLOCK_M/BLOCK_N
            for name, tile in backward_tiles(block_size).items():
                options.setdefault(name, tile)
    if q.is_cuda and contiguous_blocks:
        options.setdefault("BLOCKS_ARE_CONTIGUOUS", True)
    return options or None


def _max_offset(x: torch.Tensor) -> int:
    """The largest element offset a kernel computes from x's data pointer."""
    return sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()) if size)


def flex_attend(flex, q, k, v, block_mask, options, with_lse: bool = False):
    """Compiled FlexAttention of ``q (B, H, M, D)`` over ``k, v (B, H_kv, L, D)`` (grouped
    K/V shared: ``enable_gqa``); with ``with_lse`` also the natural-log log-sum-exp
    ``(B, H, M)`` in float32.

    torch 2.11's kernel computes element offsets in 32 bits (past 2^31 the output is silently
    wrong: flex vs the exact gather path on an H200). Where an offset of q, k, v or the
    output would reach that, it runs once per (batch, head) on contiguous copies, whose
    offsets stay below 2^31 while L x D does; past that it refuses."""
    batch, heads, rows, head_dim = q.shape
    groups = heads // k.shape[1]
    extra = {**(_lse_request() if with_lse else {}), **({"enable_gqa": True} if groups > 1 else {})}
    if max(_max_offset(x) for x in (q, k, v)) < FLEX_MAX_OFFSET and q.numel() < FLEX_MAX_OFFSET:
        return _flex_result(flex(q, k, v, block_mask=block_mask, kernel_options=options, **extra), with_lse)
    if max(rows, k.shape[2]) * head_dim >= FLEX_MAX_OFFSET:
        raise RuntimeError(
            f"block-sparse: FlexAttention indexes with 32-bit offsets and one head of "
            f"{max(rows, k.shape[2]):,} tokens x {head_dim} is past 2^31; use kernel=gather or a shorter N"
        )
    out = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:3], dtype=torch.float32) if with_lse else None
    extra.pop("enable_gqa", None)  # one query head at a time reads its own key/value head
    for b in range(batch):
        for h in range(heads):
            one, its_kv = (slice(b, b + 1), slice(h, h + 1)), (slice(b, b + 1), slice(h // groups, h // groups + 1))
            inputs = (q[one].contiguous(), k[its_kv].contiguous(), v[its_kv].contiguous())
            got = _flex_result(flex(*inputs, block_mask=block_mask, kernel_options=options, **extra), with_lse)
            if with_lse:
                out[one], lse[one] = got
            else:
                out[one] = got
    return (out, lse) if with_lse else out


@functools.cache
def _lse_request() -> dict[str, bool | AuxRequest]:
    try:  # torch >= 2.9 asks through AuxRequest; return_lse is deprecated there
        from torch.nn.attention.flex_attention import AuxRequest

        return {"return_aux": AuxRequest(lse=True)}
    except ImportError:
        return {"return_lse": True}


def _flex_result(result, with_lse: bool):
    if not with_lse:
        return result
    out, aux = result
    return out, (aux if isinstance(aux, torch.Tensor) else aux.lse).float()


@functools.cache
def diagonal_causal(block_size: int):
    """Causal mask inside a diagonal block. Partial blocks are only diagonal blocks and chunks
    start on block boundaries, so positions within the block decide."""

    def diagonal_causal(b, h, q_idx, kv_idx):
        return (q_idx % block_size) >= (kv_idx % block_size)

    return diagonal_causal


def parse_kernel_options(text: str) -> KernelOptions:
    """'BLOCK_M=128,BLOCK_N=64,PRESCALE_QK=true' -> FlexAttention kernel_options."""
    options: KernelOptions = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"block-sparse: kernel_options item {item!r}: write KEY=VALUE, e.g. BLOCK_M=128,num_warps=8"
            )
        value = value.strip()
        if value.lower() in ("true", "false"):
            options[key.strip()] = value.lower() == "true"
        else:
            try:
                options[key.strip()] = int(value)
            except ValueError:
                options[key.strip()] = value
    return options


@functools.cache
def has_compute_q_blocks() -> bool:
    """Forward-only masks skip the transposed (query-side) indices where torch allows it."""
    from torch.nn.attention.flex_attention import BlockMask

    return "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters


def compact_indices_ok(device_type: str) -> bool:
    """Whether index rows narrower than the key blocks are safe. No release attnbench has
    checked takes them: torch 2.13's lowerings assert full-width rows, and torch 2.11's GPU
    lowering accepts narrow rows without a word but computes a wrong output (the GPU test of
    tests/test_block_sparse_gpu.py on an H200, 2026-11-22). Full rows everywhere, then;
    chunks of query blocks keep their size bounded."""
    return False


_COMPILED: dict[str, Any] = {}


def compiled_flex(mode: str):
    """One compiled flex_attention per compile mode, shared by every instance."""
    if mode not in _COMPILED:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # flex_attention run eagerly ignores the block mask's sparsity: never fall back to it
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
        if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
            torch._dynamo.config.fail_on_recompile_limit_hit = True
        _COMPILED[mode] = torch.compile(flex_attention, dynamic=False, mode=None if mode == "default" else mode)
    return _COMPILED[mode]


def flex_compile_mode(q, block_size: int, grad: bool, configured: str) -> str:
    """The compile mode of the flex calls. Inductor's backward lowering drops every config of
    its heuristics whose own tiles do not divide the sparse block, before kernel_options are
    applied: on an H100/H200 (bf16, head dim 64) its one default config is (64, 128, 128, 64),
    so blocks under 128 tokens leave no choice at all (NoValidChoicesError, torch 2.11 on an
    H200). max-autotune adds its tile list (32 and 64 wide), which has configs that divide
    such blocks; ``backward_tiles`` then fixes their tiles."""
    if grad and q.is_cuda and block_size < 128:
        return "max-autotune-no-cudagraphs"
    return configured
