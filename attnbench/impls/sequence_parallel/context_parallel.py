"""``context-parallel``: PyTorch's own ring over SDPA (torch.distributed.tensor.experimental),
CUDA only. Grouped K/V are copied to every query head before PyTorch's ring takes them: its
handling of grouped heads is not checked here (the row says expanded)."""

from __future__ import annotations

import torch

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.families.dense import CUDA_KERNELS
from attnbench.impls.sequence_parallel.base import DenseSequenceParallel


def context_parallel_support() -> str:
    """'' when this torch has context parallelism, else why not (imports it: ~1 s)."""
    try:
        from torch.distributed.tensor.experimental._attention import (  # noqa: F401
            _cp_options,
            _disable_context_parallel_dispatcher,
            _enable_context_parallel_dispatcher,
            set_rotate_method,
        )
    except Exception as exc:  # private API: absent or moved in this release
        return f"not in torch {torch.__version__} ({type(exc).__name__}: {exc})"
    return ""


def context_parallel_availability() -> str:
    """The line ``attnbench list`` shows."""
    reason = context_parallel_support()
    if reason:
        return f"UNAVAILABLE: {reason}"
    # "available" must not read as usable where its one device is missing
    if torch.version.cuda is None:
        return f"needs CUDA: not usable with this torch build ({torch.__version__}, no CUDA)"
    if not torch.cuda.is_available():
        return f"needs CUDA: in torch {torch.__version__}, but no CUDA GPU is visible"
    return f"available in torch {torch.__version__}"


class ContextParallelAttention(DenseSequenceParallel):
    """``F.scaled_dot_product_attention`` on DTensors sharded along the sequence, with
    PyTorch's context-parallel dispatcher: its ring (all-gather or all-to-all rotation of
    K/V) around the fused SDPA kernels. CUDA only (its ring handles the CUDA kernels). Causal
    uses its head-tail load balancing, the same zigzag layout as ``ring``."""

    def __init__(self, backend: str = "auto", rotate_method: str = "allgather") -> None:
        super().__init__()
        reason = context_parallel_support()
        if reason:
            raise ConfigError(f"context-parallel: unavailable, {reason}; use ring")
        self.backend = backend
        self.rotate_method = rotate_method
        self._mesh = None

    def config(self):
        return {"backend": self.backend, "rotate_method": self.rotate_method}

    def _forward(self, q, k, v, is_causal, rank, world, clock):
        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        from torch.distributed.tensor.experimental._attention import (
            _cp_options,
            _disable_context_parallel_dispatcher,
            _enable_context_parallel_dispatcher,
            set_rotate_method,
        )
        from torch.nn.attention import sdpa_kernel

        from attnbench.impls.dense import SDPA_BACKENDS

        if q.device.type != "cuda":
            raise ConfigError(
                "context-parallel runs on CUDA only (PyTorch's ring handles the CUDA SDPA kernels); use ring on the CPU"
            )
        if self._mesh is None or self._mesh.size() != world:
            self._mesh = init_device_mesh("cuda", (world,))
        k, v = gqa.expanded_for(self, q, k, v)
        set_rotate_method(self.rotate_method)
        _cp_options.enable_load_balance = is_causal  # its head-tail layout is our zigzag
        qd, kd, vd = (DTensor.from_local(x.transpose(1, 2), self._mesh, [Shard(2)], run_check=False) for x in (q, k, v))
        # the fused kernels only: its ring handles those; math would fall back to DTensor's all-gather
        names = [self.backend] if self.backend != "auto" else list(CUDA_KERNELS)
        backends = [SDPA_BACKENDS[name] for name in names]
        _enable_context_parallel_dispatcher()
        try:
            with sdpa_kernel(backends):
                out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=is_causal)
        finally:
            _disable_context_parallel_dispatcher()
        with sdpa_kernel(backends):  # the kernel SDPA picks for one local block, for the row
            from attnbench.impls.dense import sdpa_backend_in_use

            kernel = sdpa_backend_in_use(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal)
        self.last_backend = f"context-parallel/{self.rotate_method}/{kernel}"
        clock.mark("compute")  # its communication is inside PyTorch: booked as compute
        return out.to_local().transpose(1, 2)
