"""What one trial measures: the shape, dtype and device, and its FLOP and byte accounting."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from attnbench.errors import AttnbenchError
from attnbench.units import brief

if TYPE_CHECKING:
    import torch

# Bytes per element of each dtype's name: the byte counts need no torch, so options are
# checked before torch is imported.
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
MODES = ("fwd", "fwd_bwd")
# Backward of attention costs 2.5x the forward (docs/design/semantics.md), so fwd+bwd is 3.5x.
MODE_FLOP_FACTOR = {"fwd": 1.0, "fwd_bwd": 3.5}
# Tensors the pass cannot avoid holding, as (query-shaped, key/value-shaped): q and out, k and v
# (+ dout and dq, dk and dv for the backward). K and V have kv_heads heads, the others heads.
MODE_FLOOR_TENSORS = {"fwd": (2, 2), "fwd_bwd": (4, 4)}


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
    #: key/value heads shared by groups of query heads (grouped-query attention); None: as
    #: many as ``heads``. Kept None when equal, so such a workload is the same as before GQA.
    kv_heads: int | None = None
    #: the model preset the shape came from (``attnbench models``); bookkeeping, not the shape
    model: str | None = None

    def __post_init__(self) -> None:
        if self.kv_heads == self.heads:
            object.__setattr__(self, "kv_heads", None)

    def with_seq_len(self, seq_len: int) -> Workload:
        return Workload(**{**asdict(self), "seq_len": seq_len})

    def to_dict(self) -> dict[str, str | int | bool | dict[str, Any] | None]:
        """The fields, less the optional ones left unset (a workload without grouped heads or
        a model keeps the keys, and so the series key, it had before they existed)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in OPTIONAL_FIELDS}

    @property
    def kv_head_count(self) -> int:
        """Key/value heads: ``kv_heads``, or ``heads`` without grouping."""
        return self.kv_heads or self.heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def element_bytes(self) -> int:
        return DTYPES[self.dtype]

    @property
    def tensor_bytes(self) -> int:
        """Bytes of one (B, N, H, D) tensor (query-shaped: q, the output and their gradients)."""
        return self.batch * self.seq_len * self.heads * self.head_dim * self.element_bytes

    @property
    def kv_tensor_bytes(self) -> int:
        """Bytes of one (B, N, H_kv, D) tensor (k, v and their gradients)."""
        return self.batch * self.seq_len * self.kv_head_count * self.head_dim * self.element_bytes

    @property
    def floor_bytes(self) -> int:
        """The memory floor: inputs and outputs the pass must hold (docs/design/semantics.md)."""
        query_like, kv_like = MODE_FLOOR_TENSORS[self.mode]
        return query_like * self.tensor_bytes + kv_like * self.kv_tensor_bytes

    def flops(self, pairs: int) -> float:
        """4 * B * D FLOPs per (query, key) pair (QK^T and PV, multiply-add = 2)."""
        return 4.0 * self.batch * self.head_dim * pairs * MODE_FLOP_FACTOR[self.mode]

    def make_inputs(self, generator: torch.Generator | None = None):
        """Random normal q ``(B, N, H, D)``, k and v ``(B, N, H_kv, D)`` on the device;
        grad-enabled for the backward mode."""
        import torch

        shapes = [(self.batch, self.seq_len, h, self.head_dim) for h in (self.heads, *[self.kv_head_count] * 2)]
        tensors = [
            torch.randn(shape, dtype=self.torch_dtype, device=self.device, generator=generator) for shape in shapes
        ]
        if self.mode == "fwd_bwd":
            for t in tensors:
                t.requires_grad_(True)
        return tensors


OPTIONAL_FIELDS = ("kv_heads", "model")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype's name (fp32, fp16, bf16)."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def check_heads(heads: int, kv_heads: int | None) -> None:
    """Query heads share key/value heads in equal groups: ``heads`` a multiple of ``kv_heads``."""
    if kv_heads is None:
        return
    if kv_heads <= 0:
        raise AttnbenchError(f"--kv-heads must be positive, got {kv_heads}")
    if heads % kv_heads:
        divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise AttnbenchError(
            f"--heads {heads} is not a multiple of --kv-heads {kv_heads}: query heads share key/value "
            f"heads in equal groups, so --kv-heads must divide --heads (here one of {divisors})"
        )


def check_workload_fields(dtype: str, mode: str, device: str) -> None:
    if dtype not in DTYPES:
        raise AttnbenchError(f"unknown dtype {brief(dtype)}: choose one of {', '.join(DTYPES)}")
    if mode not in MODES:
        raise AttnbenchError(f"unknown mode {brief(mode)}: choose fwd or fwd_bwd")
    if device not in ("cpu", "cuda"):
        raise AttnbenchError(f"unknown device {brief(device)}: choose cpu or cuda")
