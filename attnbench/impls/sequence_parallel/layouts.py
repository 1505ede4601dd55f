"""Shard layouts: which global positions a rank holds, in local order."""

from __future__ import annotations

from typing import Any

import torch

from attnbench.errors import ConfigError


def contiguous_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    n = seq_len // world
    return torch.arange(rank * n, (rank + 1) * n)


def zigzag_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    """Chunks r and 2p-1-r of 2p equal chunks: each rank gets an early and a late chunk."""
    c = seq_len // (2 * world)
    late = 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(late * c, (late + 1) * c)])


def striped_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    """Every p-th token from r (r, r+p, r+2p, ...): striped ring attention's layout, in which
    every rank holds the same share of each causal row."""
    return torch.arange(rank, seq_len, world)


#: layout name -> (positions, how many equal pieces per rank the length must split into)
LAYOUTS = {
    "contiguous": (contiguous_positions, 1),
    "zigzag": (zigzag_positions, 2),
    "striped": (striped_positions, 1),
}


def check_layout(where: str, layout: Any) -> None:
    """A declared layout is one of ``LAYOUTS``; else one line naming them and the alternative."""
    if layout not in LAYOUTS:
        raise ConfigError(
            f"{where}: shard layout {layout!r} is not one of {', '.join(LAYOUTS)}; "
            "or declare shard_positions(seq_len, world, rank, causal) on the module"
        )
