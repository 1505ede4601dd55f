"""Block-sparse attention patterns: small pure functions that return compact block lists.

A pattern says, for each query block ``i`` of ``nb`` blocks, which key blocks it keeps. At
N = 16M tokens with 128-token blocks and a 5% kept fraction every row keeps ~6,500 key blocks
(~860M block pairs in all), too many to list one by one. So each row is stored as a few
disjoint arithmetic progressions of key blocks, ``(start, stop, step)`` meaning
``range(start, stop, step)``: an int64 tensor of shape ``(nb, R, 3)``. Counting is exact and
cheap (the progressions of a row never overlap); explicit indices are made only for a chunk of
rows at a time (:meth:`BlockPattern.expand`). No ``nb x nb`` object is ever built, except by
:meth:`BlockPattern.dense` for pictures and tests at small ``nb``. ``BlockPattern`` and the
arithmetic on progressions live in ``attnbench.masks.block_lists``; this module holds the rules.

Every pattern has one free size (a window, a segment, a dilation factor) chosen so that the
kept fraction of block pairs is as close as it can get to ``sparsity_ratio``. The pairs a
pattern may keep are all ``nb^2`` block pairs, or with ``causal`` the ``nb(nb+1)/2`` pairs on
or below the diagonal: a causal pattern is sized for that triangle, and keeps no block above
the diagonal (the upper triangle inside the diagonal block is masked by the kernels).

The rules (docs/design/block-sparse.md, "Patterns", has pictures):

- ``local_window``: row ``i`` keeps ``w`` consecutive blocks centred on ``i``, shifted inwards
  at the ends of the sequence (every row keeps exactly ``w``); causal: the ``w`` blocks
  ending at ``i``.
- ``global_local``: ``g = round(K/4)`` global blocks (``K`` the per-row budget): the first
  ``g`` blocks are kept by every row and the first ``g`` rows keep every block; plus the
  local window of ``w`` blocks.
- ``dilated_sparse``: LongNet's dilated attention on blocks. Scales ``s`` with segment
  lengths ``W_s`` (blocks, each dividing the next) and dilation rates ``r_s`` (each dividing
  the next): row ``i`` keeps, at each scale, the blocks ``j`` of its own ``W_s``-segment with
  ``j = i (mod r_s)``. Default scales: ``W_s = W_0 * 2^s``, ``r_s = 2^s`` up to the whole
  sequence (fewer scales where rows are too short to meet the ratio with all of them).
- ``hierarchical``: the same scales, but every row of a segment shares one coarse grid
  ``j = 0 (mod r_s)`` with ``r_0 = 1``: the own segment is kept whole, farther keys are
  seen through every ``r_s``-th block. Default ``W_s = W_0 * 4^s``, ``r_s = 4^s``.

For the two multi-scale patterns, segment lengths and dilation rates that are given are used;
what is not given is solved from the ratio: without segment lengths ``W_0`` is sized; with
segment lengths the dilation rates are ``c`` times the given (or ``W_s / W_0``) rates, with
the integer ``c >= 1`` sized (for ``hierarchical`` ``r_0`` stays 1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from attnbench.errors import ConfigError
from attnbench.masks import MULTISCALE, PATTERN_TYPES
from attnbench.masks.block_lists import BlockPattern, allowed_blocks
from attnbench.units import brief

# growth of segment length and dilation rate between scales when none are given
DEFAULT_SCALE_FACTOR = {"dilated_sparse": 2, "hierarchical": 4}
# the kept fraction must land within this relative distance of the ratio...
RATIO_TOLERANCE = 0.2
# ...or within one block per row on average (rows too short for 20% steps)


# ---------------------------------------------------------------------------------------
# The patterns
# ---------------------------------------------------------------------------------------


def build_pattern(
    pattern_type: str,
    num_blocks: int,
    sparsity_ratio: float,
    causal: bool = False,
    segment_blocks: list[int] | None = None,
    dilation_rates: list[int] | None = None,
) -> BlockPattern:
    """The named pattern over ``num_blocks`` blocks, sized for ``sparsity_ratio``."""
    if pattern_type not in PATTERN_TYPES:
        raise ConfigError(f"unknown pattern type {brief(pattern_type)}: choose one of {', '.join(PATTERN_TYPES)}")
    if not 0 < sparsity_ratio <= 1:
        raise ConfigError(
            f"sparsity_ratio {sparsity_ratio} is the kept fraction of block pairs and must be in (0, 1], "
            "e.g. 0.05 keeps 5% (95% sparse)"
        )
    if num_blocks <= 0:
        raise ConfigError("a pattern needs at least one block")
    if pattern_type not in MULTISCALE and (segment_blocks or dilation_rates):
        raise ConfigError(
            f"{pattern_type} takes no segment_lengths or dilation_rates (only dilated_sparse and "
            "hierarchical do): drop them"
        )
    builder = {
        "local_window": local_window,
        "global_local": global_local,
        "dilated_sparse": dilated_sparse,
        "hierarchical": hierarchical,
    }[pattern_type]
    if pattern_type in MULTISCALE:
        pattern = builder(num_blocks, sparsity_ratio, causal, segment_blocks, dilation_rates)
    else:
        pattern = builder(num_blocks, sparsity_ratio, causal)
    check_kept_fraction(pattern)
    return pattern


def check_kept_fraction(p: BlockPattern) -> None:
    target = p.sparsity_ratio * p.allowed_blocks
    if not fraction_fits(p.kept_blocks, target, p.num_blocks):
        raise ConfigError(
            f"{p.pattern_type} ({p.describe()}) keeps {p.kept_fraction:.3g} of the block pairs at {p.num_blocks} blocks, "
            f"not within {RATIO_TOLERANCE:.0%} of sparsity_ratio {p.sparsity_ratio}: set sparsity_ratio near "
            f"{p.kept_fraction:.3g}, or change segment_lengths / dilation_rates / block_size"
        )


def fraction_fits(kept: int, target: float, num_blocks: int) -> bool:
    """Within 20% of the target, or within one block per row on average."""
    gap = abs(kept - target)
    return gap <= RATIO_TOLERANCE * target or gap <= num_blocks


def local_window(nb: int, ratio: float, causal: bool) -> BlockPattern:
    rows = np.arange(nb)

    def progressions(w: int) -> np.ndarray:
        return _window(rows, nb, w, causal)[:, None, :]

    w, prog = _nearest(progressions, 1, nb, ratio * allowed_blocks(nb, causal))
    return BlockPattern("local_window", nb, causal, ratio, torch.from_numpy(prog), shape={"window": w})


def global_local(nb: int, ratio: float, causal: bool) -> BlockPattern:
    rows = np.arange(nb)
    budget_per_row = ratio * allowed_blocks(nb, causal) / nb
    g = min(int(round(budget_per_row / 4)), nb // 2)

    def progressions(w: int) -> np.ndarray:
        window = _window(rows, nb, w, causal)
        window[:, 0] = np.maximum(window[:, 0], g)  # the global blocks are listed once
        glob = np.stack([np.zeros_like(rows), np.full_like(rows, g), np.ones_like(rows)], axis=1)
        is_global_row = rows < g
        glob[is_global_row, 1] = rows[is_global_row] + 1 if causal else nb  # global rows keep every block
        window[is_global_row] = (0, 0, 1)
        if causal:
            glob[:, 1] = np.minimum(glob[:, 1], rows + 1)
        return np.stack([glob, window], axis=1)

    w, prog = _nearest(progressions, 1, nb, ratio * allowed_blocks(nb, causal))
    return BlockPattern(
        "global_local", nb, causal, ratio, torch.from_numpy(prog), dense_rows=g, shape={"window": w, "global_blocks": g}
    )


def dilated_sparse(nb, ratio, causal, segment_blocks=None, dilation_rates=None) -> BlockPattern:
    return _multiscale_pattern("dilated_sparse", nb, ratio, causal, segment_blocks, dilation_rates)


def hierarchical(nb, ratio, causal, segment_blocks=None, dilation_rates=None) -> BlockPattern:
    return _multiscale_pattern("hierarchical", nb, ratio, causal, segment_blocks, dilation_rates)


def _window(rows: np.ndarray, nb: int, w: int, causal: bool) -> np.ndarray:
    """(nb, 3): ``w`` consecutive blocks centred on the row (shifted inwards), or ending at it."""
    if causal:
        start = np.maximum(rows - w + 1, 0)
        stop = rows + 1
    else:
        start = np.clip(rows - (w - 1) // 2, 0, nb - w)
        stop = start + w
    return np.stack([start, stop, np.ones_like(rows)], axis=1)


def check_scales(pattern_type: str, nb: int, segment_blocks, dilation_rates) -> None:
    """Given segment lengths (in blocks) and dilation rates must nest and fit the sequence."""
    if segment_blocks:
        if any(w <= 0 for w in segment_blocks):
            raise ConfigError(f"{pattern_type}: segment lengths must be positive")
        for a, b in zip(segment_blocks, segment_blocks[1:]):
            if b <= a or b % a:
                raise ConfigError(
                    f"{pattern_type}: each segment length must divide the next, longer one "
                    f"(got {a} then {b} blocks), e.g. 2048,4096,8192"
                )
        if nb % segment_blocks[-1]:
            raise ConfigError(
                f"{pattern_type}: the longest segment ({segment_blocks[-1]} blocks) does not divide the "
                f"sequence of {nb} blocks; choose a sequence length that is a multiple of it"
            )
    if dilation_rates:
        if any(r <= 0 for r in dilation_rates):
            raise ConfigError(f"{pattern_type}: dilation rates must be positive")
        for a, b in zip(dilation_rates, dilation_rates[1:]):
            if b % a:
                raise ConfigError(
                    f"{pattern_type}: each dilation rate must divide the next (got {a} then {b}), e.g. 1,2,4"
                )
        if pattern_type == "hierarchical" and dilation_rates[0] != 1:
            raise ConfigError(
                "hierarchical: the first dilation rate must be 1 (each block keeps its own segment whole)"
            )
    if segment_blocks and dilation_rates and len(segment_blocks) != len(dilation_rates):
        raise ConfigError(
            f"{pattern_type}: {len(segment_blocks)} segment lengths but {len(dilation_rates)} dilation "
            "rates; give one dilation rate per segment length"
        )


def _multiscale_pattern(kind, nb, ratio, causal, segment_blocks, dilation_rates) -> BlockPattern:
    check_scales(kind, nb, segment_blocks, dilation_rates)
    factor = DEFAULT_SCALE_FACTOR[kind]
    target = ratio * allowed_blocks(nb, causal)
    if segment_blocks:
        base = list(dilation_rates) if dilation_rates else [w // segment_blocks[0] for w in segment_blocks]
        first = 0 if kind == "dilated_sparse" else 1  # hierarchical keeps r_0 = 1

        def geometry(c: int):
            return list(segment_blocks), base[:first] + [c * r for r in base[first:]]

        lo, hi = 1, max(segment_blocks)
    elif dilation_rates:

        def geometry(m: int):
            return [m * r for r in dilation_rates], list(dilation_rates)

        lo, hi = 1, max(1, -(-nb // dilation_rates[0]))
    else:
        return _default_scales(kind, nb, ratio, causal, factor, target)

    def progressions(x: int) -> np.ndarray:
        return multiscale_progressions(nb, *geometry(x), query_phase=kind == "dilated_sparse", causal=causal)

    def count(x: int) -> int:
        return multiscale_count(nb, *geometry(x), query_phase=kind == "dilated_sparse", causal=causal)

    x, prog = _nearest(progressions, lo, hi, target, count)
    segments, rates = geometry(x)
    return BlockPattern(
        kind, nb, causal, ratio, torch.from_numpy(prog), shape={"segment_blocks": segments, "dilation_rates": rates}
    )


def _default_scales(kind, nb, ratio, causal, factor, target) -> BlockPattern:
    """Segments ``W_0 * factor^s`` and rates ``factor^s`` for s < G: the most scales (the
    farthest reach) whose best ``W_0`` keeps a fraction that fits the ratio."""
    scales = 1
    while factor ** (scales - 1) < nb:
        scales += 1
    closest = None
    for g in range(scales, 0, -1):

        def geometry(w0: int, g=g) -> int:
            # scales past the first whose segment covers the sequence add nothing
            return next(s for s in range(g) if s == g - 1 or w0 * factor**s >= nb) + 1

        def scales_of(w0: int, g=g) -> tuple[list[int], list[int]]:
            used = geometry(w0, g)
            return [w0 * factor**s for s in range(used)], [factor**s for s in range(used)]

        def progressions(w0: int) -> np.ndarray:
            return multiscale_progressions(nb, *scales_of(w0), query_phase=kind == "dilated_sparse", causal=causal)

        def count(w0: int) -> int:
            return multiscale_count(nb, *scales_of(w0), query_phase=kind == "dilated_sparse", causal=causal)

        w0, prog = _nearest(progressions, 1, nb, target, count)
        kept = int(_lengths(prog).sum())
        if closest is None or abs(kept - target) < abs(closest[0] - target):
            closest = (kept, w0, geometry(w0, g), prog)
        if fraction_fits(kept, target, nb):
            break
    _, w0, used, prog = closest
    shape = {
        "segment_blocks": [w0 * factor**s for s in range(used)],
        "dilation_rates": [factor**s for s in range(used)],
    }
    return BlockPattern(kind, nb, causal, ratio, torch.from_numpy(prog), shape=shape)


def multiscale_progressions(
    nb: int, segments: list[int], rates: list[int], query_phase: bool, causal: bool
) -> np.ndarray:
    """(nb, 2G-1, 3). Scale s keeps the blocks j of the row's own segment of ``segments[s]``
    blocks with ``j = phase (mod rates[s])``, phase = the row (dilated) or 0 (hierarchical).
    Because segments nest and rates divide each other, scale s adds nothing inside the
    segment of scale s-1; it adds the part to the left and the part to the right of it:
    disjoint progressions, listed left to right."""
    parts = _multiscale_parts(nb, segments, rates, query_phase, causal, np.int64)
    return np.stack([np.stack([first, stop, np.full_like(first, r)], axis=1) for first, stop, r in parts], axis=1)


def multiscale_count(nb: int, segments: list[int], rates: list[int], query_phase: bool, causal: bool) -> int:
    """Kept block pairs of multiscale_progressions, without building it (int32 where it fits)."""
    total = 0
    dtype = np.int32 if max(rates) + 2 * nb < 2**31 else np.int64
    for first, stop, r in _multiscale_parts(nb, segments, rates, query_phase, causal, dtype):
        span = stop - first
        span += r - 1
        lengths = span >> (r.bit_length() - 1) if r & (r - 1) == 0 else span // r
        total += int(np.maximum(lengths, 0).sum(dtype=np.int64))
    return total


def _multiscale_parts(nb, segments, rates, query_phase, causal, dtype) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(first, stop, rate) of each progression, left to right, as (nb,) arrays."""
    rows = np.arange(nb, dtype=dtype)
    phase = rows if query_phase else np.zeros_like(rows)
    seg_start = [rows // w * w if w < nb else np.zeros_like(rows) for w in segments]
    seg_stop = [np.minimum(s + w, nb) if w < nb else np.full_like(rows, nb) for s, w in zip(seg_start, segments)]

    def ap(start, stop, r):
        offset = (phase - start) & (r - 1) if r & (r - 1) == 0 else (phase - start) % r
        stop = np.minimum(stop, rows + 1) if causal else stop
        return start + offset, stop, r  # first j >= start with j = phase (mod r)

    left = [ap(seg_start[s], seg_start[s - 1], rates[s]) for s in range(len(segments) - 1, 0, -1)]
    right = [ap(seg_stop[s - 1], seg_stop[s], rates[s]) for s in range(1, len(segments))]
    return left + [ap(seg_start[0], seg_stop[0], rates[0])] + right


def _lengths(prog: np.ndarray) -> np.ndarray:
    """progression_lengths for the numpy arrays the builders work in (single-threaded, cheap)."""
    start, stop, step = prog[..., 0], prog[..., 1], prog[..., 2]
    return np.maximum((stop - start + step - 1) // step, 0)


def _nearest(
    progressions: Callable[[int], np.ndarray],
    lo: int,
    hi: int,
    target: float,
    count: Callable[[int], int] | None = None,
) -> tuple[int, np.ndarray]:
    """The size in [lo, hi] whose pattern keeps the number of block pairs nearest ``target``.
    Kept pairs move (almost) monotonically and smoothly with the size: shrink a bracket of
    the target by interpolation, every other step by halving (never slower than bisection),
    then look around its ends."""
    counts: dict[int, int] = {}
    count = count or (lambda x: int(_lengths(progressions(x)).sum()))
    sign = 1 if count(hi) >= count(lo) else -1

    def gap(x: int) -> float:  # increasing in x; the answer is where it crosses 0
        if x not in counts:
            counts[x] = count(x)
        return sign * (counts[x] - target)

    a, b = lo, hi
    halve = False
    while b - a > 1 and gap(a) < 0 < gap(b):
        x = (a + b) // 2 if halve else a + round((b - a) * -gap(a) / (gap(b) - gap(a)))
        x = min(max(x, a + 1), b - 1)
        a, b = (x, b) if gap(x) < 0 else (a, x)
        halve = not halve
    candidates = [x for x in range(a - 2, b + 3) if lo <= x <= hi]
    best = min(candidates, key=lambda x: (abs(gap(x)), x))
    return best, progressions(best)
