"""FlexAttention with any mask_mod: ``--impl flex --param mask=pkg.module:mask_fn``.

The mask is an attention-gym style ``mask_mod(b, h, q_idx, kv_idx)``, or a function returning
one when ``mask_args`` is given (``--param mask_args=window_size=256``: keyword arguments,
comma-separated). On CUDA the block mask is built by a compiled kernel (never N x N) and
attention runs through ``torch.compile(flex_attention)``; on the CPU both run uncompiled
(FlexAttention's exact eager path, which materialises the scores: small N only). Grouped K/V
are shared (``enable_gqa``); the mask_mod's ``h`` is the query head.
"""

from __future__ import annotations

from typing import Any

import torch

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.base import AttentionImpl, quiet_eager_flex
from attnbench.impls.config import Config
from attnbench.masks import mask_mod as masks
from attnbench.units import brief

# FlexAttention's tile: the block mask's unit, and the lengths flex runs at.
FLEX_GRANULARITY = masks.BLOCK

_compiled_flex = None


def _flex_attention(device: str):
    """Compiled FlexAttention on CUDA (once per process); the eager reference path elsewhere."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if device != "cuda":
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def _parse_args(text: str | None) -> Config:
    """``window_size=256,scale=0.5`` -> keyword arguments, numbers converted."""
    out: Config = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"flex: mask_args item {brief(item)}: write KEY=VALUE[,KEY=VALUE], e.g. window_size=256")
        out[key.strip()] = _number(value.strip())
    return out


def _number(text: str) -> int | float | str:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def load_mask_mod(path: str, mask_args: str | None = None):
    """The mask_mod named by ``path`` (called with ``mask_args`` when given); ConfigError naming the fix."""
    from attnbench.impls.outside import load_object

    fn = load_object(path, what="mask_fn")
    if not callable(fn):
        raise ConfigError(
            f"flex: mask {path} is a {type(fn).__name__}, not callable: name a function "
            "mask_mod(b, h, q_idx, kv_idx) returning a boolean tensor"
        )
    args = _parse_args(mask_args)
    if not args:
        return fn
    try:
        mod = fn(**args)
    except Exception as exc:
        raise ConfigError(f"flex: {path}(**{args}) raised {type(exc).__name__}: {exc}; fix mask_args") from None
    if not callable(mod):
        raise ConfigError(f"flex: {path}(**{args}) returned a {type(mod).__name__}, not a mask_mod")
    return mod


class FlexAttention(AttentionImpl):
    """FlexAttention over the key sets a mask_mod declares."""

    compiles = True  # on CUDA the first call compiles the kernel (on the CPU it is a plain call)
    counted_pairs = True  # from the mask_mod, outside the trial

    def __init__(self, mask: str, mask_args: str | None = None) -> None:
        super().__init__()
        self.mask, self.mask_args = mask, mask_args
        self.mask_mod = load_mask_mod(mask, mask_args)
        self._check_mask_mod()
        self._block_masks: dict[tuple, Any] = {}
        self._pairs: dict[tuple, int] = {}
        self.pairs_counted = "blocks"

    def _check_mask_mod(self) -> None:
        try:
            probe = masks.key_mask(self.mask_mod, 8, 2)
        except Exception as exc:
            raise ConfigError(
                f"flex: mask {self.mask} fails on index tensors ({type(exc).__name__}: {exc}); "
                "a mask_mod takes (b, h, q_idx, kv_idx) tensors and returns booleans"
            ) from None
        self.per_head = masks.heads_differ(self.mask_mod) if probe.shape == (2, 8, 8) else True

    def config(self) -> Config:
        return {"mask": self.mask, **({"mask_args": self.mask_args} if self.mask_args else {})}

    @property
    def granularity(self) -> int:
        return FLEX_GRANULARITY

    def _block_mask(self, seq_len: int, num_heads: int, causal: bool, device: str):
        from torch.nn.attention.flex_attention import create_block_mask

        key = (seq_len, num_heads, causal, device)
        if key not in self._block_masks:
            mod = masks.with_causal(self.mask_mod) if causal else self.mask_mod
            # a head-independent mask is one block mask broadcast over the heads
            heads = num_heads if self.per_head else None
            self._block_masks = {
                key: create_block_mask(
                    mod, None, heads, seq_len, seq_len, device=device, BLOCK_SIZE=masks.BLOCK, _compile=device == "cuda"
                )
            }
        return self._block_masks[key]

    def forward(self, q, k, v, is_causal: bool = False):
        device = q.device.type
        block_mask = self._block_mask(q.shape[1], q.shape[2], is_causal, device)
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        self.last_backend = "flex (compiled)" if device == "cuda" else "flex (eager)"
        with quiet_eager_flex():
            grouped = {"enable_gqa": True} if gqa.heads_differ(qh, kh, 1) else {}
            out = _flex_attention(device)(qh, kh, vh, block_mask=block_mask, **grouped)
        return out.transpose(1, 2)

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        sets = masks.key_mask(self.mask_mod, seq_len, num_heads if self.per_head else 1)
        return sets.expand(num_heads, seq_len, seq_len)

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        """Counted from the mask_mod (``masks.mask_mod.count_pairs``: by tiles, exact), once per
        shape; a sweep counts them outside its trials (``trials.counting``)."""
        key = (seq_len, num_heads, causal)
        if key not in self._pairs:
            mod = masks.with_causal(self.mask_mod) if causal else self.mask_mod
            self._pairs[key], self.pairs_counted = masks.count_pairs(mod, seq_len, num_heads)
        return self._pairs[key]


def build_flex(mask: str | None = None, mask_args: str | None = None) -> FlexAttention:
    if not mask:
        raise ConfigError(
            "flex needs a mask: --param mask=pkg.module:mask_fn (an attention-gym style mask_mod(b, h, q_idx, kv_idx))"
        )
    return FlexAttention(mask, mask_args)
