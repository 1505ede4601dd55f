"""Hilbert-curve order of tokens laid out on a 2-D grid (row-major).

``curve_order(seq_len, grid_width)`` returns ``order``: ``order[i]`` is the row-major index
of the i-th token along the curve, so ``x[:, order]`` is the sequence in curve order and
``pi = inverse(order)`` maps an original position to its curve position (docs/design/semantics.md:
``M_h(t) = pi^-1(M_pattern(pi(t)))``).

The grid is ``rows x cols``. A Hilbert curve fills a square whose side is a power of two, so
the grid is tiled with the largest such squares that fit both sides (side ``s``: the largest
power of two dividing ``gcd(rows, cols)``); tiles are visited in row-major order and each is
filled by the Hilbert curve. A square grid of side ``2^k`` is one Hilbert curve. Segments
and blocks of consecutive curve positions are then compact 2-D patches.

``grid_width = 0`` picks the grid from the length alone: ``N = m * 4^k`` with ``4^k`` the
largest power of four dividing ``N`` gives ``2^k`` rows and ``m * 2^k`` columns, so every
length has a grid. A given width must divide ``N`` (``N / width`` rows).
"""

from __future__ import annotations

import math

import torch

from attnbench.errors import ConfigError


def grid_shape(seq_len: int, grid_width: int = 0) -> tuple[int, int]:
    """(rows, cols) of the token grid; ConfigError when the length cannot form it."""
    if seq_len <= 0:
        raise ConfigError("hilbert: the sequence length must be positive")
    if grid_width < 0:
        raise ConfigError(f"hilbert: grid_width must be 0 (automatic) or positive, got {grid_width}")
    if grid_width:
        if seq_len % grid_width:
            raise ConfigError(
                f"hilbert: sequence length {seq_len} does not form a grid of width {grid_width}: "
                f"choose a length that is a multiple of {grid_width} or another --param grid_width"
            )
        return seq_len // grid_width, grid_width
    side = 1
    while seq_len % (4 * side * side) == 0:
        side *= 2
    return side, seq_len // side


def tile_side(rows: int, cols: int) -> int:
    """The largest power of two dividing both sides: the side of each Hilbert square."""
    g = math.gcd(rows, cols)
    return g & -g


def hilbert_d2xy(side: int, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of distance ``d`` along the Hilbert curve of a ``side x side`` square (side a
    power of two): the classic iterative construction, vectorised over ``d``."""
    x = torch.zeros_like(d)
    y = torch.zeros_like(d)
    t = d.clone()
    s = 1
    while s < side:
        rx = (t // 2) & 1
        ry = (t ^ rx) & 1
        # rotate the quadrant: flip when rx == 1 and ry == 0, then swap x and y when ry == 0
        flip = (ry == 0) & (rx == 1)
        x = torch.where(flip, s - 1 - x, x)
        y = torch.where(flip, s - 1 - y, y)
        swap = ry == 0
        x, y = torch.where(swap, y, x), torch.where(swap, x, y)
        x = x + s * rx
        y = y + s * ry
        t = t // 4
        s *= 2
    return x, y


def curve_order(seq_len: int, grid_width: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    """``order[i]`` = row-major position of the i-th token along the curve (a permutation)."""
    rows, cols = grid_shape(seq_len, grid_width)
    s = tile_side(rows, cols)
    i = torch.arange(seq_len, device=device, dtype=torch.int64)
    tile, d = i // (s * s), i % (s * s)
    tiles_per_row = cols // s
    x, y = hilbert_d2xy(s, d)
    row = (tile // tiles_per_row) * s + y
    col = (tile % tiles_per_row) * s + x
    return row * cols + col


def inverse(order: torch.Tensor) -> torch.Tensor:
    """``pi`` with ``pi[order[i]] = i``: original position -> curve position."""
    pi = torch.empty_like(order)
    pi[order] = torch.arange(order.numel(), device=order.device, dtype=order.dtype)
    return pi
