"""The base class of the sequence-parallel implementations (key sets, counts and shape rules
from the single-device counterpart; the process group; the step clock of the last call), the
dense layout shared by ``ring`` and ``context-parallel``, and the registry pieces they share."""

from __future__ import annotations

import torch

from attnbench.errors import ConfigError
from attnbench.impls import build
from attnbench.impls.base import AttentionImpl
from attnbench.impls.config import Config
from attnbench.impls.dense import DENSE_GRANULARITY
from attnbench.impls.sequence_parallel.engine import StepClock
from attnbench.impls.sequence_parallel.layouts import contiguous_positions, zigzag_positions


class SequenceParallelAttention(AttentionImpl):
    """A distributed implementation; its key sets are its single-device counterpart's."""

    #: registry name of the single-device implementation computing the same thing
    counterpart_name = "sdpa"
    #: a call captures into one CUDA graph with its exchanges (no host synchronisation) and
    #: replays right on every rank: its trials also take GPU time, the ring without the host
    graph_capturable = False

    def __init__(self) -> None:
        super().__init__()
        #: ranks the global sequence is split over; None: the process group's size (1 outside one)
        self.world_size: int | None = None
        self.group = None
        self._clock: StepClock | None = None

    # --- the process group ---------------------------------------------------------------
    def world(self) -> int:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            actual = dist.get_world_size(self.group)
            if self.world_size not in (None, actual):
                raise ConfigError(
                    f"{self.name}: configured for {self.world_size} ranks but the process group has {actual}"
                )
            return actual
        return self.world_size or 1

    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    # --- declarations --------------------------------------------------------------------
    def counterpart_config(self) -> Config:
        return {}

    def counterpart(self) -> AttentionImpl:
        return build(self.counterpart_name, **self.counterpart_config())

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        return self.counterpart()._key_sets(seq_len, num_heads)

    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        self.check_shape(seq_len, num_heads)
        return self.counterpart().key_mask(seq_len, num_heads, causal)

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return self.counterpart().useful_pairs(seq_len, num_heads, causal)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return self.counterpart().executed_pairs(seq_len, num_heads, causal)

    def shard_positions(self, seq_len: int, rank: int, causal: bool) -> torch.Tensor:
        """Global positions of the rank's local tokens, in local order."""
        return contiguous_positions(seq_len, self.world(), rank)

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        world = self.world()
        if seq_len % world:
            raise ConfigError(
                f"{self.name}: sequence length {seq_len} does not split over {world} ranks; "
                f"choose a multiple of {self.granularity}"
            )
        super().check_shape(seq_len, num_heads)

    def check_causal(self, causal: bool) -> None:
        if causal and not self.supports_causal:
            raise ConfigError(f"{self.name} runs non-causal only (a 2-D grid has no causal order); drop --causal")

    def verify_seq_len(self) -> int:
        return self.granularity

    # --- running -------------------------------------------------------------------------
    def forward(self, q, k, v, is_causal: bool = False):
        world, rank = self.world(), self.rank()
        batch, n, num_heads, _ = q.shape
        self.check_shape(n * world, num_heads)
        self.check_causal(is_causal)
        self._clock = StepClock(q.device)
        self._clock.mark("start")
        return self._forward(q, k, v, is_causal, rank, world, self._clock)

    def _forward(self, q, k, v, is_causal, rank, world, clock) -> torch.Tensor:
        raise NotImplementedError

    def last_breakdown(self) -> dict[str, float | int]:
        """Compute vs communication wait of the last call; read after it finished."""
        return self._clock.summary() if self._clock else {}


class DenseSequenceParallel(SequenceParallelAttention):
    """The dense layout shared by ``ring`` and PyTorch's context parallel: contiguous shards,
    or zigzag (head-tail) ones when causal so every rank gets equal work."""

    counterpart_name = "sdpa"

    @property
    def granularity(self) -> int:
        return DENSE_GRANULARITY * self.world()

    def shard_positions(self, seq_len, rank, causal):
        world = self.world()
        return zigzag_positions(seq_len, world, rank) if causal else contiguous_positions(seq_len, world, rank)
