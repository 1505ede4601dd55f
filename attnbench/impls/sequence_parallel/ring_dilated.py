"""``ring-dilated``: LongNet dilated attention over the split sequence. Head groups whose
segments lie inside a shard run locally; a group whose segment spans shards exchanges only
the kept (dilated) K/V positions of its heads between the ranks of a segment. Grouped K/V
travel as the key/value heads each head group reads (``dilated.head_groups``), shared by its
query heads."""

from __future__ import annotations

import torch

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.base import lcm
from attnbench.impls.dilated import HeadGroup, attend_group, head_groups, scale_segments, validate_pattern
from attnbench.impls.fused_sdpa import shares_kv
from attnbench.impls.sequence_parallel.base import SequenceParallelAttention
from attnbench.impls.sequence_parallel.engine import (
    LseAccumulator,
    RingSchedule,
    Selection,
    attend_with_lse,
    kept_slice,
    run_ring,
)


def check_segments_fit(name: str, seq_len: int, world: int, segment_lengths) -> None:
    """Each segment lies inside one rank's shard or spans whole shards."""
    n = seq_len // world
    for w in segment_lengths:
        if n % w and w % n:
            step = lcm(segment_lengths) * world
            raise ConfigError(
                f"{name}: {n} tokens per rank ({seq_len} over {world} ranks) neither hold whole segments of "
                f"{w} nor tile one; choose a sequence length that is a multiple of {step}"
            )


class DilatedSchedule(RingSchedule):
    """Head groups whose segments lie inside the shard run the single-device kernel locally
    (no communication). A group whose segment spans k = w / n shards exchanges, between the
    k ranks of a segment, only the kept (dilated) K/V positions of its heads."""

    def __init__(
        self, q, k, v, rank: int, causal: bool, groups: list[HeadGroup], max_chunk_tokens: int, backend: str
    ) -> None:
        self.q, self.k, self.v = q, k, v
        self.rank, self.causal, self.backend = rank, causal, backend
        self.n = q.shape[1]
        self.local = [g for g in groups if self.n % g.segment_length == 0]
        self.spanning = [g for g in groups if self.n % g.segment_length]
        self.max_chunk_tokens = max_chunk_tokens
        self.out = torch.zeros_like(q)  # queries outside the dilation: zero rows
        self.acc: dict[int, LseAccumulator] = {}
        self.kernel = "sdpa" if self.local else None

    def kept(self, g: HeadGroup, rank: int) -> tuple[slice, int]:
        """Local positions of ``rank`` kept by group g: in-segment offset p with p mod r = o."""
        first = (rank % (g.segment_length // self.n)) * self.n  # the shard's offset in its segment
        return kept_slice((g.offset - first) % g.dilation_rate, self.n, g.dilation_rate)

    def select(self, receiver: int, sender: int) -> list[Selection]:
        sels = []
        for i, g in enumerate(self.spanning):
            span = g.segment_length // self.n
            if receiver // span != sender // span or (self.causal and sender > receiver):
                continue
            tokens, count = self.kept(g, sender)
            if count and self.kept(g, receiver)[1]:
                sels.append(Selection(tokens, g.heads_of(kv=True), count, key=i))
        return sels

    def attend(self, sender, pieces) -> None:
        if sender == self.rank:
            for g in self.local:
                attend_group(self.q, self.k, self.v, self.out, g, self.causal, self.max_chunk_tokens)
        for sel, (k, v) in zip(self.select(self.rank, sender), pieces):
            g = self.spanning[sel.key]
            rows, _ = self.kept(g, self.rank)
            qh = self.q[:, rows, g.heads].transpose(1, 2)
            out, lse, self.kernel = attend_with_lse(
                qh, k.transpose(1, 2), v.transpose(1, 2), self.causal and sender == self.rank, self.backend
            )
            self.acc.setdefault(sel.key, LseAccumulator(tuple(qh.shape), qh.device, qh.dtype)).add(out, lse)

    def finish(self) -> torch.Tensor:
        for i, acc in self.acc.items():
            g = self.spanning[i]
            rows, _ = self.kept(g, self.rank)
            self.out[:, rows, g.heads] = acc.result().transpose(1, 2)
        return self.out


class RingDilatedAttention(SequenceParallelAttention):
    counterpart_name = "dilated"

    def __init__(
        self,
        segment_lengths=(2048, 4096),
        dilation_rates=(1, 2),
        max_chunk_tokens: int = 1 << 19,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        validate_pattern(segment_lengths, dilation_rates)
        if max_chunk_tokens <= 0:
            raise ConfigError(f"{self.name or 'ring-dilated'}: max_chunk_tokens must be positive")
        self.segment_lengths = list(segment_lengths)
        self.dilation_rates = list(dilation_rates)
        self.max_chunk_tokens = max_chunk_tokens
        self.backend = backend

    def config(self):
        return {
            "segment_lengths": self.segment_lengths,
            "dilation_rates": self.dilation_rates,
            "max_chunk_tokens": self.max_chunk_tokens,
            "backend": self.backend,
        }

    def counterpart_config(self):
        return {
            "segment_lengths": self.segment_lengths,
            "dilation_rates": self.dilation_rates,
            "max_chunk_tokens": self.max_chunk_tokens,
        }

    def scaled_config(self, factor: int):
        return scale_segments(self.config(), factor)

    @property
    def granularity(self) -> int:
        """Search step: whole segments on every rank (shorter valid lengths exist, see check_shape)."""
        return lcm(self.segment_lengths) * self.world()

    def verify_seq_len(self) -> int:
        # the smallest length where the longest segments span ranks, so the exchange is checked
        short = lcm(self.segment_lengths)
        try:
            self.check_shape(short, len(self.segment_lengths))
            return short
        except ConfigError:
            return self.granularity

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        self.counterpart().check_shape(seq_len, num_heads)
        world = self.world()
        if seq_len % world:
            raise ConfigError(
                f"{self.name}: sequence length {seq_len} does not split over {world} ranks; "
                f"choose a multiple of {self.granularity}"
            )
        check_segments_fit(self.name, seq_len, world, self.segment_lengths)

    def _forward(self, q, k, v, is_causal, rank, world, clock):
        groups = head_groups(q.shape[2], self.segment_lengths, self.dilation_rates, k.shape[2])
        schedule = DilatedSchedule(q, k, v, rank, is_causal, groups, self.max_chunk_tokens, self.backend)
        run_ring(schedule, k, v, rank, world, self.group, clock)
        self.last_backend = schedule.kernel
        self.last_kv_layout = gqa.layout(q, k, expanded=not shares_kv(schedule.kernel or ""))
        return schedule.finish()
