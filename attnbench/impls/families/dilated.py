"""LongNet dilated attention: ``dilated`` on one device, ``ring-dilated`` and
``ring-dilated-hilbert`` over ranks (computing what ``dilated`` computes). Their code:
``impls/dilated.py`` and ``impls/sequence_parallel/``."""

from __future__ import annotations

from attnbench.impls import register
from attnbench.impls.entry import ImplSpec, Lazy, Param
from attnbench.impls.families.dense import KERNEL_PARAM, SDPA_BACKENDS, SEQPAR_EXTRA

# the family the report draws these with, and whose configurations its dilation section compares
DILATED = "dilated"
KERNELS = ("auto", "sdpa")
SEGMENT_PARAMS = (
    Param("segment_lengths", [2048, 4096], "segment length per head group", kind="ints"),
    Param("dilation_rates", [1, 2], "dilation rate per head group (divides its segment)", kind="ints"),
    Param("max_chunk_tokens", 1 << 19, "tokens per kernel launch of the local segments (bounds temporary memory)"),
)
DILATED_VERIFY = (
    {"segment_lengths": [16, 32], "dilation_rates": [1, 2]},
    {"segment_lengths": [8, 16, 32], "dilation_rates": [1, 2, 4], "max_chunk_tokens": 16},
    {"segment_lengths": [32, 32], "dilation_rates": [4, 2]},
    {"segment_lengths": [16], "dilation_rates": [8]},  # some ranks keep no query of a segment
)

register(
    ImplSpec(
        name="dilated",
        factory=Lazy("attnbench.impls.dilated:build_dilated"),
        summary="LongNet dilated attention: head groups x (segment, dilation), dense attention per segment (Triton, SDPA)",
        family=DILATED,
        params=(
            Param("segment_lengths", [2048, 4096], "segment length per head group", kind="ints"),
            Param("dilation_rates", [1, 2], "dilation rate per head group (divides its segment)", kind="ints"),
            Param("max_chunk_tokens", 1 << 19, "tokens per kernel launch (bounds temporary memory)"),
            Param(
                "hilbert",
                False,
                "reorder the tokens (a 2-D grid, row-major) along a Hilbert curve first",
                kind="bool",
                recorded_at_default=False,
            ),
            Param(
                "grid_width",
                0,
                "hilbert: grid width in tokens (0: automatic from the length)",
                recorded_at_default=False,
            ),
            Param(
                "backend",
                "auto",
                "SDPA backend of the segment attentions",
                kind="str",
                choices=("auto", *SDPA_BACKENDS),
                recorded_at_default=False,
            ),
            Param(
                "kernel",
                "auto",
                "forward without autograd: auto (a Triton kernel reading the dilation in place, on CUDA in fp16/bf16) or sdpa",
                kind="str",
                choices=KERNELS,
                recorded_at_default=False,
            ),
        ),
        verify_configs=(
            {"segment_lengths": [16], "dilation_rates": [1]},
            {"segment_lengths": [16, 32], "dilation_rates": [1, 2]},
            {"segment_lengths": [8, 16, 32], "dilation_rates": [1, 2, 4], "max_chunk_tokens": 16},
            {"segment_lengths": [32, 32], "dilation_rates": [4, 2]},
            {"segment_lengths": [16, 32], "dilation_rates": [1, 2], "hilbert": True},
            {"segment_lengths": [16, 32], "dilation_rates": [2, 4], "hilbert": True, "grid_width": 16},
        ),
    )
)

register(
    ImplSpec(
        name="ring-dilated",
        factory=Lazy("attnbench.impls.sequence_parallel.ring_dilated:RingDilatedAttention"),
        summary="LongNet dilated attention over the split sequence: local segments stay local, spanning ones send kept K/V only",
        params=(*SEGMENT_PARAMS, KERNEL_PARAM),
        verify_configs=DILATED_VERIFY,
        distributed=True,
        counterpart="dilated",
        family=DILATED,
        extra=SEQPAR_EXTRA,
    )
)

register(
    ImplSpec(
        name="ring-dilated-hilbert",
        factory=Lazy("attnbench.impls.sequence_parallel.ring_dilated_hilbert:RingDilatedHilbertAttention"),
        summary="ring-dilated over a 2-D token grid in Hilbert-curve order (shards = curve runs); non-causal",
        params=(
            *SEGMENT_PARAMS,
            Param("grid_width", 0, "grid width in tokens (0: automatic from the length)"),
            KERNEL_PARAM,
        ),
        verify_configs=DILATED_VERIFY[:2]
        + ({"segment_lengths": [16, 32], "dilation_rates": [2, 4], "grid_width": 16},),
        distributed=True,
        counterpart="dilated",
        family=DILATED,
        extra=SEQPAR_EXTRA,
    )
)
