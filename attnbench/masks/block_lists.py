"""Block lists: which key blocks each query block keeps, stored as a few disjoint arithmetic
progressions per row (``BlockPattern``), and the arithmetic on them: counting, clipping to a
range of key blocks, spans, and expansion into explicit indices a chunk of rows at a time.
The rules that fill them are in ``attnbench.masks.patterns``."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch


@dataclass(frozen=True)
class BlockPattern:
    """Kept key blocks of every query block, as disjoint progressions per row."""

    pattern_type: str
    num_blocks: int
    causal: bool
    sparsity_ratio: float
    progressions: torch.Tensor  # (nb, R, 3) int64: start, stop, step
    dense_rows: int = 0  # rows [0, dense_rows) keep every allowed block
    shape: dict[str, Any] = field(default_factory=dict)  # the sizes chosen (window, segments, ...)

    # --- counting ----------------------------------------------------------------------
    @cached_property
    def row_counts(self) -> torch.Tensor:
        """Kept key blocks per query block, (nb,) int64."""
        return progression_lengths(self.progressions).sum(dim=1)

    @cached_property
    def kept_blocks(self) -> int:
        return int(self.row_counts.sum())

    @property
    def allowed_blocks(self) -> int:
        """Block pairs the pattern may keep: all, or those on or below the diagonal."""
        return allowed_blocks(self.num_blocks, self.causal)

    @property
    def kept_fraction(self) -> float:
        return self.kept_blocks / self.allowed_blocks

    @cached_property
    def max_row_blocks(self) -> int:
        return int(self.row_counts.max())

    # --- explicit indices, a chunk of rows at a time -----------------------------------
    def expand(
        self,
        row_start: int,
        row_stop: int,
        width: int | None = None,
        device=None,
        drop_diagonal: bool = False,
        keys: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(indices, counts)`` for rows ``[row_start, row_stop)``: indices ``(rows, width)``
        int64, ascending in each row, padded with 0 after ``counts[r]`` entries.
        ``drop_diagonal`` leaves out block ``i`` of row ``i`` (a causal pattern's partial block);
        ``keys`` keeps only the key blocks in ``[lo, hi)``."""
        prog = self.progressions[row_start:row_stop]
        if drop_diagonal:
            rows = torch.arange(row_start, row_stop, device=prog.device)
            prog = prog.clone()
            prog[:, :, 1] = torch.minimum(prog[:, :, 1], rows[:, None])  # causal stops are <= i + 1
        if keys is not None:
            prog = clip_progressions(prog, *keys)
        return expand_progressions(prog, width, device)

    def kept_in(self, row_start: int, row_stop: int, lo: int, hi: int) -> int:
        """Kept blocks of rows ``[row_start, row_stop)`` among key blocks ``[lo, hi)``."""
        return int(progression_lengths(clip_progressions(self.progressions[row_start:row_stop], lo, hi)).sum())

    def dense(self) -> torch.Tensor:
        """The ``(nb, nb)`` boolean block mask: for pictures and tests at small nb only."""
        nb = self.num_blocks
        if nb > 16384:
            raise ValueError(f"dense block mask of {nb} x {nb} blocks is too large; use expand()")
        idx, counts = self.expand(0, nb)
        mask = torch.zeros(nb, nb, dtype=torch.bool)
        valid = torch.arange(idx.shape[1])[None, :] < counts[:, None]
        rows = torch.arange(nb)[:, None].expand_as(idx)
        mask[rows[valid], idx[valid]] = True
        return mask

    def describe(self) -> str:
        bits = [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in self.shape.items()]
        return " ".join(bits)


def allowed_blocks(num_blocks: int, causal: bool) -> int:
    return num_blocks * (num_blocks + 1) // 2 if causal else num_blocks * num_blocks


def progression_lengths(prog: torch.Tensor) -> torch.Tensor:
    """Elements of ``range(start, stop, step)`` for each progression (0 when empty)."""
    start, stop, step = prog.unbind(-1)
    return torch.div(stop - start + step - 1, step, rounding_mode="floor").clamp_(min=0)


def clip_progressions(prog: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The elements of each progression that lie in ``[lo, hi)``, still progressions: the
    start moves up to the first element at or past ``lo`` (same phase), the stop down to ``hi``."""
    start, stop, step = prog.unbind(-1)
    behind = (lo - start).clamp(min=0)
    start = start + torch.div(behind + step - 1, step, rounding_mode="floor") * step
    return torch.stack([start, stop.clamp(max=hi), step], dim=-1)


def progression_spans(prog: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of progressions ``(rows, R, 3)``: its first kept block and one past its last
    (0, 0 for a row that keeps none)."""
    start, _, step = prog.unbind(-1)
    lengths = progression_lengths(prog)
    kept = lengths > 0
    last = start + (lengths - 1).clamp(min=0) * step
    any_kept = kept.any(dim=1)
    first = torch.where(kept, start, torch.iinfo(torch.int64).max).min(dim=1).values
    stop = torch.where(kept, last, -1).max(dim=1).values + 1
    return torch.where(any_kept, first, 0), torch.where(any_kept, stop, 0)


def expand_progressions(prog: torch.Tensor, width: int | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of disjoint progressions ``(rows, R, 3)`` -> padded explicit indices and counts, on
    ``device`` (default: prog's). The sizes are read where prog lies (the CPU, for a pattern's
    own lists), so expanding onto a GPU never waits for the work queued there."""
    rows = prog.shape[0]
    lengths = progression_lengths(prog)  # (rows, R)
    most = int(lengths.sum(dim=1).max()) if rows else 0
    width = max(most if width is None else width, 1)
    if most > width:
        raise ValueError(f"a row keeps {most} blocks, more than the width {width}")
    values, counts = flatten_progressions(prog, device)
    out = torch.zeros(rows, width, dtype=torch.int64, device=counts.device)
    if values.numel() == 0:
        return out, counts
    row = torch.repeat_interleave(torch.arange(rows, device=counts.device), counts, output_size=values.numel())
    row_first = torch.cumsum(counts, 0) - counts
    col = torch.arange(values.numel(), device=counts.device) - row_first[row]
    out[row, col] = values
    return out, counts


def flatten_progressions(prog: torch.Tensor, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of disjoint progressions ``(rows, R, 3)`` -> every kept block, row after row (each
    row's progressions in order), int64, and the count of each row: a compressed-row list on
    ``device`` (default: prog's). Sizes are read where prog lies, as in ``expand_progressions``."""
    rows, num_prog, _ = prog.shape
    total = int(progression_lengths(prog).sum())
    device = prog.device if device is None else torch.device(device)
    if prog.device != device:
        prog = to_device(prog, device)
    lengths = progression_lengths(prog)
    counts = lengths.sum(dim=1)
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=device), counts
    flat_len = lengths.reshape(-1)
    prog_id = torch.repeat_interleave(torch.arange(rows * num_prog, device=device), flat_len, output_size=total)
    prog_first = torch.cumsum(flat_len, 0) - flat_len  # flat position of each progression's first element
    k = torch.arange(total, device=device) - prog_first[prog_id]
    flat = prog.reshape(-1, 3)
    return flat[prog_id, 0] + flat[prog_id, 2] * k, counts


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of a CPU tensor on ``device``. To a GPU through pinned memory, without waiting:
    a copy from pageable memory waits for everything queued on the GPU first."""
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)
