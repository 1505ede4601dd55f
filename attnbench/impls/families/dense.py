"""Dense attention and what splits it over ranks: ``naive`` (the N x N scores held), ``sdpa``
(torch's fused kernels), ``ring`` and ``context-parallel`` (one sequence over P ranks,
computing what ``sdpa`` computes). Their code: ``impls/dense.py`` and
``impls/sequence_parallel/``."""

from __future__ import annotations

from attnbench.impls import register
from attnbench.impls.entry import ImplSpec, Lazy, Param

# SDPA's kernels by name (impls/dense.py maps each to its backend); the CPU has flash and math
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
CUDA_KERNELS = ("flash", "efficient", "cudnn")  # the fused ones
# what every sequence-parallel implementation of this package takes and runs
KERNEL_PARAM = Param(
    "backend",
    "auto",
    "fused kernel per block on CUDA (auto: the one SDPA picks); the CPU has one",
    kind="str",
    choices=("auto", *CUDA_KERNELS),
)
SEQPAR_EXTRA = {"modes": ("fwd",)}  # forward only: the ring has no backward pass yet

register(
    ImplSpec(
        name="naive",
        factory=Lazy("attnbench.impls.dense:NaiveAttention"),
        summary="standard attention: materialises N x N scores (O(N^2) memory)",
        memory_order=2,
    )
)

register(
    ImplSpec(
        name="sdpa",
        factory=Lazy("attnbench.impls.dense:build_sdpa"),
        summary="torch scaled_dot_product_attention; the row records the backend that ran",
        params=(
            Param("backend", "auto", "SDPA backend", kind="str", choices=("auto", *SDPA_BACKENDS)),
            Param(
                "expand_kv",
                False,
                "grouped heads: copy K and V to every query head first instead of sharing them (enable_gqa)",
                kind="bool",
                recorded_at_default=False,
            ),
        ),
        verify_configs=({"backend": "auto"}, {"backend": "math"}),
    )
)

register(
    ImplSpec(
        name="ring",
        factory=Lazy("attnbench.impls.sequence_parallel.ring:RingAttention"),
        summary="dense ring attention: K/V around the ranks, overlapped with compute, log-sum-exp merge (zigzag when causal)",
        params=(KERNEL_PARAM,),
        verify_configs=({},),
        distributed=True,
        counterpart="sdpa",
        extra=SEQPAR_EXTRA,
    )
)

register(
    ImplSpec(
        name="context-parallel",
        factory=Lazy("attnbench.impls.sequence_parallel.context_parallel:ContextParallelAttention"),
        summary="PyTorch's context parallel (torch.distributed.tensor.experimental: its ring over the fused SDPA kernels), CUDA only",
        params=(
            Param("backend", "auto", "SDPA backend", kind="str", choices=("auto", *CUDA_KERNELS)),
            Param("rotate_method", "allgather", "how PyTorch moves K/V", kind="str", choices=("allgather", "alltoall")),
        ),
        devices=("cuda",),
        dtypes=("fp16", "bf16", "fp32"),
        distributed=True,
        counterpart="sdpa",
        extra={
            **SEQPAR_EXTRA,
            "availability": Lazy("attnbench.impls.sequence_parallel.context_parallel:context_parallel_availability"),
        },
    )
)
