"""A picture of a block pattern, drawn from its block lists (never an nb x nb array at large nb)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from attnbench.masks.block_lists import BlockPattern, expand_progressions

# At most this many pixels per side; larger patterns are drawn one sampled row per pixel row.
MAX_PIXELS = 1024


def pattern_image(p: BlockPattern, pixels: int = MAX_PIXELS) -> torch.Tensor:
    """``(P, P)`` float in [0, 1]: the kept share of the key blocks under each pixel, for the
    query block at the middle of each pixel row. Exact (one pixel per block) when nb <= P."""
    nb = p.num_blocks
    size = min(nb, pixels)
    rows = (torch.arange(size) * nb + nb // 2) // size if size < nb else torch.arange(nb)
    idx, counts = expand_progressions(p.progressions[rows])
    kept = torch.arange(idx.shape[1])[None, :] < counts[:, None]
    cells = idx * size // nb  # pixel column of each kept block
    flat = (torch.arange(size)[:, None] * size + cells)[kept]
    hits = torch.bincount(flat, minlength=size * size).reshape(size, size).float()
    blocks_per_cell = torch.bincount(torch.arange(nb) * size // nb, minlength=size).float()
    return hits / blocks_per_cell[None, :]


def draw_pattern(p: BlockPattern, block_size: int, path: Path) -> Path:
    from attnbench.report.plots.figures import png, pyplot
    from attnbench.results import write_bytes_atomic

    n = p.num_blocks * block_size
    fig, ax = pyplot().subplots(figsize=(5.6, 5.8), dpi=100)
    ax.imshow(pattern_image(p).numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest", extent=(0, n, n, 0))
    sampled = "" if p.num_blocks <= MAX_PIXELS else f", one row in {p.num_blocks // MAX_PIXELS} drawn"
    ax.set_title(
        f"{p.pattern_type}{' causal' if p.causal else ''}: N={n:,}, block {block_size}{sampled}\n"
        f"keeps {p.kept_fraction:.2%} of block pairs (sparsity_ratio {p.sparsity_ratio:g})\n"
        + textwrap.shorten(p.describe(), 90, placeholder=" ..."),
        fontsize=8,
    )
    ax.set_xlabel("key position (tokens)", fontsize=8)
    ax.set_ylabel("query position (tokens)", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    path = Path(path)
    write_bytes_atomic(path, png(fig))
    return path
