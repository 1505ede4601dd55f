"""A user's sequence-parallel module behind the attnbench contract (``impls.outside``): it
runs on its rank's shard in the process group attnbench starts, as the built-in rings do; its
key sets, pair counts and reference are its declared single-device counterpart's, and its
shard layout is what it declares (a named layout or its own positions)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.base import quiet_eager_flex
from attnbench.impls.config import Config
from attnbench.impls.sequence_parallel.base import SequenceParallelAttention
from attnbench.impls.sequence_parallel.layouts import LAYOUTS, check_layout

#: the layout name of a module that gives its own ``shard_positions``
OWN_LAYOUT = "own"


class OutsideSequenceParallel(SequenceParallelAttention):
    def __init__(self, inner: nn.Module, config: dict[str, Any], declared: dict[str, Any]) -> None:
        super().__init__()
        self.inner = inner
        self._config = dict(config)
        self.counterpart_name = declared["counterpart"]
        self._counterpart_params = dict(declared.get("counterpart_params") or {})
        kind = type(inner).__name__
        if callable(getattr(inner, "shard_positions", None)):
            self.layout = OWN_LAYOUT
        else:
            self.layout = getattr(inner, "shard_layout", None) or declared.get("layout", "contiguous")
            check_layout(f"{kind}.shard_layout", self.layout)
        self.rank_granularity = int(getattr(inner, "granularity", 1) or 1)
        self.compiles = bool(getattr(inner, "compiles", False))
        self.supports_causal = bool(getattr(inner, "supports_causal", True))
        self.supports_gqa = bool(getattr(inner, "supports_gqa", False))

    def config(self) -> Config:
        return dict(self._config)

    def counterpart_config(self) -> Config:
        return dict(self._counterpart_params)

    @property
    def granularity(self) -> int:
        pieces = LAYOUTS[self.layout][1] if self.layout in LAYOUTS else 1
        return pieces * self.world() * self.rank_granularity

    def verify_seq_len(self) -> int:
        return max(self.granularity, 128)

    def check_causal(self, causal: bool) -> None:
        if causal and not self.supports_causal:
            raise ConfigError(f"{self.name} declares supports_causal = False; drop --causal")

    def shard_positions(self, seq_len: int, rank: int, causal: bool) -> torch.Tensor:
        world = self.world()
        if self.layout == OWN_LAYOUT:
            positions = torch.as_tensor(self.inner.shard_positions(seq_len, world, rank, causal), dtype=torch.long)
            if positions.shape != (seq_len // world,):
                raise ConfigError(
                    f"{type(self.inner).__name__}.shard_positions({seq_len}, {world}, {rank}, {causal}) has "
                    f"shape {tuple(positions.shape)}: return the rank's {seq_len // world} global positions"
                )
            return positions
        return LAYOUTS[self.layout][0](seq_len, world, rank)

    def _forward(self, q, k, v, is_causal, rank, world, clock):
        if not self.supports_gqa:
            k, v = gqa.expanded_for(self, q, k, v)
        with quiet_eager_flex():
            out = self.inner(q, k, v, is_causal=is_causal)
        clock.mark("compute")  # its exchanges are inside its own code: booked as compute
        self.last_backend = getattr(self.inner, "last_backend", None)
        return out
