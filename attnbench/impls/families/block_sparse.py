"""Block-sparse attention: ``block-sparse`` on one device, ``block-sparse-ring`` over ranks (a
rank receives only the key/value blocks its pattern keeps). Their code:
``impls/block_sparse.py``, ``impls/block_sparse_ring.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnbench.impls import register
from attnbench.impls.config import Config
from attnbench.impls.entry import ImplSpec, Lazy, Param
from attnbench.masks import PATTERN_TYPES

KERNELS = ("auto", "flex", "gather", "triton")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
INDEX_WIDTHS = ("auto", "full", "compact")
# block-sparse's parameters the ring takes (its constructor's), in its configuration's order
RING_PARAMS = (
    "pattern_type",
    "sparsity_ratio",
    "block_size",
    "segment_lengths",
    "dilation_rates",
    "kernel",
    "compile_mode",
    "max_chunk_tokens",
)


# the family the report draws these with
BLOCK_SPARSE_FAMILY = "block-sparse"
# what a short name shows of a configuration
SHOWN = ("pattern_type", "sparsity_ratio", "block_size")


def short_name(prefix: str) -> Callable[[dict[str, Any]], str]:
    """A configuration as ``PREFIX:PATTERN S%/BLOCK``: 'bs:local_window 5%/128' keeps 5% of the
    block pairs of blocks of 128 tokens."""

    def name(config: Config) -> str:
        kept = f"{float(config.get('sparsity_ratio') or 0) * 100:g}%"
        return f"{prefix}:{config.get('pattern_type', '?')} {kept}/{config.get('block_size', '?')}"

    return name


def _verify_configs(device: str) -> tuple[Config, ...]:
    """Every pattern x two block sizes x two ratios (causal and not come from the cases).
    On a GPU each shape compiles a kernel, so there one block size and one ratio."""
    sizes, ratios = ((16, 32), (0.1, 0.25)) if device == "cpu" else ((32,), (0.1,))
    return tuple(
        {"pattern_type": t, "block_size": b, "sparsity_ratio": r} for t in PATTERN_TYPES for b in sizes for r in ratios
    )


def _ring_verify_configs(device: str) -> tuple[Config, ...]:
    """Every pattern (causal and not come from the cases); chunked merges; a sparser
    hierarchical whose far segments send only their coarse grid. On a GPU every shape and
    ring step compiles a kernel: three patterns there."""
    configs = tuple({"pattern_type": t, "block_size": 16, "sparsity_ratio": 0.25} for t in PATTERN_TYPES) + (
        {"pattern_type": "local_window", "block_size": 16, "sparsity_ratio": 0.1, "max_chunk_tokens": 48},
        {"pattern_type": "hierarchical", "block_size": 32, "sparsity_ratio": 0.1},
    )
    if device == "cpu":
        return configs
    return tuple({**c, "block_size": 32} for c in configs[:4] if c["pattern_type"] != "dilated_sparse")


BLOCK_SPARSE = register(
    ImplSpec(
        name="block-sparse",
        factory=Lazy("attnbench.impls.block_sparse:build_block_sparse"),
        summary="block-sparse attention (local_window, dilated_sparse, global_local, hierarchical): FlexAttention on GPU",
        family=BLOCK_SPARSE_FAMILY,
        short_name=short_name("bs"),
        shown=SHOWN,
        params=(
            Param("pattern_type", "local_window", "block pattern", kind="str", choices=PATTERN_TYPES),
            Param("sparsity_ratio", 0.05, "kept fraction of block pairs (0.05 = 95% sparse)", kind="float"),
            Param("block_size", 128, "tokens per block: 16, 32, 64, 128 or 256"),
            Param(
                "segment_lengths",
                None,
                "dilated_sparse/hierarchical: segment lengths in tokens (optional)",
                kind="ints",
            ),
            Param(
                "dilation_rates", None, "dilated_sparse/hierarchical: dilation rates in blocks (optional)", kind="ints"
            ),
            Param(
                "kernel",
                "auto",
                "flex (compiled FlexAttention), gather, or triton (a Triton forward on CUDA in fp16/bf16, flex "
                "under autograd); auto: flex on GPU",
                kind="str",
                choices=KERNELS,
            ),
            Param(
                "kernel_options",
                "",
                "FlexAttention kernel options, e.g. BLOCK_M=128,BLOCK_N=64,num_warps=8",
                kind="str",
            ),
            Param("compile_mode", "default", "torch.compile mode for flex", kind="str", choices=COMPILE_MODES),
            Param("max_chunk_tokens", 1 << 20, "query tokens per kernel call (bounds temporary memory)"),
            Param(
                "index_width",
                "auto",
                "flex mask rows: one column per key block (full), as many as a row keeps "
                "(compact, GPU only), auto: full while small",
                kind="str",
                choices=INDEX_WIDTHS,
            ),
        ),
        verify_configs=_verify_configs,
    )
)

register(
    ImplSpec(
        name="block-sparse-ring",
        factory=Lazy("attnbench.impls.block_sparse_ring:BlockSparseRingAttention"),
        summary="block-sparse attention over the split sequence: a rank receives only the K/V blocks its pattern keeps",
        family=BLOCK_SPARSE_FAMILY,
        short_name=short_name("bs-ring"),
        shown=SHOWN,
        params=tuple(p for p in BLOCK_SPARSE.params if p.name in RING_PARAMS),
        verify_configs=_ring_verify_configs,
        distributed=True,
        counterpart="block-sparse",
        extra={"modes": ("fwd",)},
    )
)
