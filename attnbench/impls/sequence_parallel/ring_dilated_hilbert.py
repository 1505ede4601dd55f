"""``ring-dilated-hilbert``: ring-dilated over a 2-D token grid in Hilbert-curve order, the
shards being consecutive runs of the curve; non-causal."""

from __future__ import annotations

import torch

from attnbench.errors import ConfigError
from attnbench.impls.dilated import hilbert_twin
from attnbench.impls.sequence_parallel.ring_dilated import RingDilatedAttention
from attnbench.masks import hilbert as hilbert_curve


class RingDilatedHilbertAttention(RingDilatedAttention):
    """ring-dilated over tokens in Hilbert-curve order: the shards are consecutive runs of
    the curve (compact 2-D patches of the grid), rank r holding curve positions
    [r n, (r+1) n); the dilated pattern holds between curve positions."""

    supports_causal = False

    def __init__(
        self,
        segment_lengths=(2048, 4096),
        dilation_rates=(1, 2),
        max_chunk_tokens: int = 1 << 19,
        grid_width: int = 0,
        backend: str = "auto",
    ) -> None:
        super().__init__(segment_lengths, dilation_rates, max_chunk_tokens, backend)
        if grid_width < 0:
            raise ConfigError(f"ring-dilated-hilbert: grid_width must be 0 (automatic) or positive, got {grid_width}")
        self.grid_width = grid_width

    def config(self):
        return {**super().config(), "grid_width": self.grid_width}

    def scaled_config(self, factor: int):
        return super().scaled_config(factor) if hilbert_twin(self.grid_width, factor) else None

    def counterpart_config(self):
        return {**super().counterpart_config(), "hilbert": True, "grid_width": self.grid_width}

    def shard_positions(self, seq_len, rank, causal):
        n = seq_len // self.world()
        return hilbert_curve.curve_order(seq_len, self.grid_width)[rank * n : (rank + 1) * n]

    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        self.check_causal(causal)
        return super().key_mask(seq_len, num_heads, causal)
