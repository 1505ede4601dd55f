"""Dense attention: every query attends to every key (causal: every earlier key)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.errors import ConfigError
from attnbench.impls import register
from attnbench.impls.base import AttentionImpl, ImplSpec, Param, dense_pairs

# Dense kernels work in tiles of this many tokens; lengths off the tile measure padding.
DENSE_GRANULARITY = 128


class _Dense(AttentionImpl):
    @property
    def granularity(self) -> int:
        return DENSE_GRANULARITY

    def verify_seq_len(self) -> int:
        return 128

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        return torch.ones(num_heads, seq_len, seq_len, dtype=torch.bool)

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return dense_pairs(seq_len, num_heads, causal)


class NaiveAttention(_Dense):
    """Standard attention: materialises the N x N scores and probabilities (O(N^2) memory)."""

    def forward(self, q, k, v, is_causal: bool = False):
        self.last_backend = "matmul+softmax"
        scale = 1.0 / math.sqrt(q.shape[-1])
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, N, D)
        scores = torch.matmul(qh * scale, kh.transpose(-1, -2))
        if is_causal:
            n = q.shape[1]
            future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
            scores.masked_fill_(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, vh).transpose(1, 2)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return dense_pairs(seq_len, num_heads, causal=False)  # the masked half is computed too


SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
_BACKEND_NAMES = {int(b.value): name for name, b in SDPA_BACKENDS.items()}


def sdpa_backend_in_use(qh, kh, vh, is_causal: bool) -> str:
    """The backend PyTorch's dispatcher picks for these inputs under the active settings."""
    try:
        choice = torch._fused_sdp_choice(qh, kh, vh, is_causal=is_causal)
    except Exception:  # private API: absent or changed in some release
        return "unknown"
    return _BACKEND_NAMES.get(int(choice), "unknown")


class SDPAAttention(_Dense):
    """``torch.nn.functional.scaled_dot_product_attention`` with a named or automatic backend."""

    def __init__(self, backend: str = "auto") -> None:
        super().__init__()
        self.backend = backend

    def config(self):
        return {"backend": self.backend}

    def forward(self, q, k, v, is_causal: bool = False):
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        if self.backend == "auto":
            self.last_backend = sdpa_backend_in_use(qh, kh, vh, is_causal)
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal)
        else:
            with sdpa_kernel([SDPA_BACKENDS[self.backend]]):
                out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal)
            self.last_backend = self.backend
        return out.transpose(1, 2)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        # the fused kernels skip fully masked tiles; math materialises everything
        return dense_pairs(seq_len, num_heads, causal and self.backend != "math")


def _sdpa(backend: str = "auto") -> SDPAAttention:
    if backend not in ("auto", *SDPA_BACKENDS):
        raise ConfigError(f"sdpa backend {backend!r} unknown: choose auto, {', '.join(SDPA_BACKENDS)}")
    return SDPAAttention(backend)


register(
    ImplSpec(
        name="naive",
        factory=NaiveAttention,
        summary="standard attention: materialises N x N scores (O(N^2) memory)",
        memory_order=2,
    )
)
register(
    ImplSpec(
        name="sdpa",
        factory=_sdpa,
        summary="torch scaled_dot_product_attention; the row records the backend that ran",
        params=(Param("backend", "auto", "SDPA backend", kind="str", choices=("auto", *SDPA_BACKENDS)),),
        verify_configs=({"backend": "auto"}, {"backend": "math"}),
    )
)
