"""`attnbench pattern`: build a block-sparse pattern from its block lists, print its kept
fraction, build time and memory, and draw it (from its block lists, never an nb x nb array at
large nb)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from attnbench.cli.base import app, console
from attnbench.cli.options import CausalOpt, DilOpt, SegOpt, impl_params
from attnbench.errors import AttnbenchError

if TYPE_CHECKING:
    from attnbench.masks.block_lists import BlockPattern


@app.command(order=110)
def pattern(
    seq_len: Annotated[str, typer.Option("--seq-len", help="sequence length, e.g. 16384 or 16M")],
    pattern_type: Annotated[
        str, typer.Option("--pattern-type", help="local_window | dilated_sparse | global_local | hierarchical")
    ] = "local_window",
    block_size: Annotated[int, typer.Option("--block-size", help="tokens per block")] = 128,
    sparsity_ratio: Annotated[
        float, typer.Option("--sparsity-ratio", help="kept fraction of block pairs (0.05 = 95% sparse)")
    ] = 0.05,
    causal: CausalOpt = None,
    segment_lengths: SegOpt = None,
    dilation_rates: DilOpt = None,
    png: Annotated[Optional[Path], typer.Option("--png", help="draw the pattern into this PNG file")] = None,
) -> None:
    """Build a block-sparse pattern from its block lists: print its kept fraction, build time and memory; draw it."""
    import time

    from attnbench.results import check_output_file
    from attnbench.units import format_bytes, format_tokens, parse_tokens

    if png:
        check_output_file(png, "--png", ".png")
    n = parse_tokens(seq_len)  # before torch is imported
    config = impl_params(segment_lengths, dilation_rates, None, None)

    from attnbench import impls
    from attnbench.measure.memory import current_rss_bytes
    from attnbench.measure.oom import is_oom
    from attnbench.measure.probe import reset_rss_peak, rss_high_water

    impl = impls.build(
        "block-sparse", pattern_type=pattern_type, block_size=block_size, sparsity_ratio=sparsity_ratio, **config
    )
    impl.check_length(n)
    reset_rss_peak()
    base = current_rss_bytes()
    t0 = time.perf_counter()
    try:
        p = impl.pattern(n, bool(causal))  # refuses a pattern that cannot keep the ratio
    except (MemoryError, RuntimeError) as exc:
        if not is_oom(exc):
            raise
        raise AttnbenchError(
            f"the {pattern_type} pattern at N={format_tokens(n)} ({n // block_size:,} blocks of {block_size}) "
            f"needs more memory than this machine has for its block lists: choose a shorter --seq-len "
            "or a larger --block-size"
        ) from None
    seconds = time.perf_counter() - t0
    grown = max(0, rss_high_water() - base)
    counts = p.row_counts.float()
    console.print(
        f"{p.pattern_type}{' causal' if p.causal else ''}  N={format_tokens(n)}  block {block_size}  "
        f"{p.num_blocks:,} query blocks  ({p.describe()})"
    )
    console.print(
        f"kept fraction {p.kept_fraction:.4f} of {'causal ' if p.causal else ''}block pairs "
        f"(sparsity_ratio {sparsity_ratio:g}); {p.kept_blocks:,} block pairs; per query block "
        f"min {int(counts.min())} / mean {float(counts.mean()):.1f} / max {int(counts.max())} key blocks"
        + (f"; {p.dense_rows} global rows keep everything" if p.dense_rows else "")
    )
    console.print(
        f"built in {seconds:.2f} s; resident memory grew by at most {format_bytes(grown)}; "
        f"compact lists {format_bytes(p.progressions.numel() * 8)}"
    )
    if png:
        console.print(f"wrote {draw_pattern(p, block_size, png)}")


# At most this many pixels per side; larger patterns are drawn one sampled row per pixel row.
MAX_PIXELS = 1024


def pattern_image(p: BlockPattern, pixels: int = MAX_PIXELS):
    """``(P, P)`` float in [0, 1]: the kept share of the key blocks under each pixel, for the
    query block at the middle of each pixel row. Exact (one pixel per block) when nb <= P."""
    import torch

    from attnbench.masks.block_lists import expand_progressions

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
    from attnbench.report.plots.drawing import png, pyplot
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
