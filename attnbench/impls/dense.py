"""Dense attention: every query attends to every key (causal: every earlier key).

Grouped K/V (fewer key/value heads than query heads) are shared, never copied: ``naive`` folds
each group's query heads into the rows of one product with their key/value head, ``sdpa``
calls SDPA with ``enable_gqa``. A named SDPA backend without a grouped-query kernel is
reported as unsupported; ``expand_kv`` copies K and V to every query head instead, to measure
what that copy costs."""

from __future__ import annotations

import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.base import AttentionImpl, dense_pairs
from attnbench.units import brief

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
        batch, n, num_heads, head_dim = q.shape
        kv_heads = k.shape[2]
        scale = 1.0 / math.sqrt(head_dim)
        kh, vh = (x.transpose(1, 2) for x in (k, v))  # (B, H_kv, N, D)
        # a group's query heads as rows of one product with their shared key/value head
        qh = q.transpose(1, 2).reshape(batch, kv_heads, -1, head_dim)  # (B, H_kv, G * N, D)
        scores = torch.matmul(qh * scale, kh.transpose(-1, -2))
        if is_causal:
            future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
            scores.unflatten(2, (-1, n)).masked_fill_(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, vh).reshape(batch, num_heads, n, head_dim).transpose(1, 2)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return dense_pairs(seq_len, num_heads, causal=False)  # the masked half is computed too


SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
_BACKEND_NAMES = {int(b.value): name for name, b in SDPA_BACKENDS.items()}
# SDPA backends with no CPU kernel (the CPU has flash and math)
CUDA_ONLY_BACKENDS = ("efficient", "cudnn")


def backend_device_problem(who: str, backend: str, device: str) -> str:
    """Why an SDPA backend cannot run on ``device`` ('' where it can)."""
    if device == "cpu" and backend in CUDA_ONLY_BACKENDS:
        return f"{who}: SDPA backend {backend} runs on CUDA only: on the CPU choose auto, flash or math, or use --device cuda"
    return ""


def sdpa_backend_in_use(qh, kh, vh, is_causal: bool) -> str:
    """The backend PyTorch's dispatcher picks for these inputs under the active settings."""
    grouped = {"enable_gqa": True} if gqa.heads_differ(qh, kh, 1) else {}
    try:
        choice = torch._fused_sdp_choice(qh, kh, vh, is_causal=is_causal, **grouped)
    except Exception:  # private API: absent or changed in some release
        return "unknown"
    return _BACKEND_NAMES.get(int(choice), "unknown")


def lacks_grouped_kernel(backend: str, qh, kh, vh, is_causal: bool) -> bool:
    """Whether the named CUDA backend refuses these grouped K/V while it takes the same call
    with as many key/value heads as queries (PyTorch's own admission checks; False where
    they cannot tell)."""
    checks = {
        "flash": "can_use_flash_attention",
        "efficient": "can_use_efficient_attention",
        "cudnn": "can_use_cudnn_attention",
    }
    check = getattr(torch.backends.cuda, checks.get(backend, ""), None)
    params = getattr(torch.backends.cuda, "SDPAParams", None)
    if check is None or params is None or not qh.is_cuda:
        return False
    try:
        grouped = check(params(qh, kh, vh, None, 0.0, is_causal, True))
        plain = check(params(qh[:, : kh.shape[1]], kh, vh, None, 0.0, is_causal, False))
    except Exception:  # the admission API changed: say nothing rather than guess
        return False
    return plain and not grouped


class SDPAAttention(_Dense):
    """``torch.nn.functional.scaled_dot_product_attention`` with a named or automatic backend."""

    def __init__(self, backend: str = "auto", expand_kv: bool = False) -> None:
        super().__init__()
        self.backend = backend
        self.expand_kv = expand_kv

    def config(self):
        return {"backend": self.backend, **({"expand_kv": True} if self.expand_kv else {})}

    def device_problem(self, device: str) -> str:
        return backend_device_problem("sdpa", self.backend, device)

    def forward(self, q, k, v, is_causal: bool = False):
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        if self.expand_kv and gqa.heads_differ(qh, kh, 1):
            groups = qh.shape[1] // kh.shape[1]
            kh, vh = (gqa.expand_kv(x, groups, 1) for x in (kh, vh))
            self.last_kv_layout = gqa.EXPANDED
        if self.backend == "auto":
            self.last_backend = sdpa_backend_in_use(qh, kh, vh, is_causal)
            out = gqa.sdpa(qh, kh, vh, is_causal=is_causal)
        else:
            with sdpa_kernel([SDPA_BACKENDS[self.backend]]):
                try:
                    out = gqa.sdpa(qh, kh, vh, is_causal=is_causal)
                except RuntimeError:
                    if gqa.heads_differ(qh, kh, 1) and lacks_grouped_kernel(self.backend, qh, kh, vh, is_causal):
                        raise gqa.NoGroupedKernel(
                            f"sdpa backend {self.backend} has no grouped-query kernel in torch {torch.__version__}: "
                            f"{qh.shape[1]} query heads over {kh.shape[1]} key/value heads are not supported; "
                            "choose another backend, or --param expand_kv=true to copy K and V to every query head"
                        ) from None
                    raise
            self.last_backend = self.backend
        return out.transpose(1, 2)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        # the fused kernels skip fully masked tiles; math materialises everything
        return dense_pairs(seq_len, num_heads, causal and self.backend != "math")


def build_sdpa(backend: str = "auto", expand_kv: bool = False) -> SDPAAttention:
    if backend not in ("auto", *SDPA_BACKENDS):
        raise ConfigError(f"sdpa backend {brief(backend)} unknown: choose auto, {', '.join(SDPA_BACKENDS)}")
    return SDPAAttention(backend, expand_kv)
