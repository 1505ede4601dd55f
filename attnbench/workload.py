"""What one trial measures: the shape, dtype and device, and its FLOP and byte accounting."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from attnbench.errors import AttnbenchError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MODES = ("fwd", "fwd_bwd")
# Backward of attention costs 2.5x the forward (docs/semantics.md), so fwd+bwd is 3.5x.
MODE_FLOP_FACTOR = {"fwd": 1.0, "fwd_bwd": 3.5}
# Tensors the pass cannot avoid holding: q, k, v, out (+ dout, dq, dk, dv for the backward).
MODE_FLOOR_TENSORS = {"fwd": 4, "fwd_bwd": 8}


@dataclass(frozen=True)
class Workload:
    impl: str
    config: dict[str, Any] = field(default_factory=dict, hash=False)
    batch: int = 1
    seq_len: int = 4096
    heads: int = 8
    head_dim: int = 64
    dtype: str = "bf16"
    device: str = "cuda"
    mode: str = "fwd"
    causal: bool = False

    def with_seq_len(self, seq_len: int) -> Workload:
        return Workload(**{**asdict(self), "seq_len": seq_len})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def tensor_bytes(self) -> int:
        """Bytes of one (B, N, H, D) tensor."""
        return self.batch * self.seq_len * self.heads * self.head_dim * self.element_bytes

    @property
    def floor_bytes(self) -> int:
        """The memory floor: inputs and outputs the pass must hold (docs/semantics.md)."""
        return MODE_FLOOR_TENSORS[self.mode] * self.tensor_bytes

    def flops(self, pairs: int) -> float:
        """4 * B * D FLOPs per (query, key) pair (QK^T and PV, multiply-add = 2)."""
        return 4.0 * self.batch * self.head_dim * pairs * MODE_FLOP_FACTOR[self.mode]

    def make_inputs(self, generator: torch.Generator | None = None):
        """Random normal q, k, v on the device; grad-enabled for the backward mode."""
        shape = (self.batch, self.seq_len, self.heads, self.head_dim)
        tensors = [
            torch.randn(shape, dtype=self.torch_dtype, device=self.device, generator=generator) for _ in range(3)
        ]
        if self.mode == "fwd_bwd":
            for t in tensors:
                t.requires_grad_(True)
        return tensors


def check_workload_fields(dtype: str, mode: str, device: str) -> None:
    if dtype not in DTYPES:
        raise AttnbenchError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if mode not in MODES:
        raise AttnbenchError(f"unknown mode {mode!r}: choose fwd or fwd_bwd")
    if device not in ("cpu", "cuda"):
        raise AttnbenchError(f"unknown device {device!r}: choose cpu or cuda")
