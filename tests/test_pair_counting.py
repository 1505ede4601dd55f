"""Pairs counted from a declared mask_mod by tiles (masks/bounds.py), and counted apart from the
measurement (trials/counting.py): the counts against hand counts, never a captured output."""

import pytest
import torch

from attnbench.masks import bounds
from attnbench.masks import mask_mod as masks
from attnbench.measure.accounting import Pairs
from attnbench.trials import counting


def window_pairs(n: int, w: int, causal: bool) -> int:
    """A query at t keeps [t-w, t+w] (causal [t-w, t]) clipped to [0, n): summed in closed form."""
    w = min(w, n - 1)
    return n * (w + 1) - w * (w + 1) // 2 if causal else n * (2 * w + 1) - w * (w + 1)


def window(w):
    def mod(b, h, q, kv):
        return (q - kv).abs() <= w

    return mod


@pytest.mark.parametrize("n", [1, 7, 300, 1000, 1237])
@pytest.mark.parametrize("w", [0, 5, 40, 299, 5000])
@pytest.mark.parametrize("causal", [False, True])
def test_a_window_by_tiles_equals_its_closed_form(n, w, causal):
    mod = masks.with_causal(window(w)) if causal else window(w)
    assert bounds.count_blocks(mod, n, 3) == 3 * window_pairs(n, w, causal)


def test_a_mask_that_reads_the_head_is_counted_head_by_head():
    def per_head(b, h, q, kv):
        return (q - kv).abs() <= 8 + 24 * h

    assert bounds.reads_head(per_head, 100, 3) and not bounds.reads_head(window(3), 100, 3)
    assert bounds.count_blocks(per_head, 777, 3) == sum(window_pairs(777, 8 + 24 * h, False) for h in range(3))


def test_a_document_mask_by_tiles_is_the_sum_of_squares_of_its_documents():
    sizes = [100, 1, 37, 400, 262]  # 800 tokens; documents start anywhere in a tile
    doc = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))

    def same_document(b, h, q, kv):
        return doc[q] == doc[kv]

    def causal_document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (kv <= q)

    assert bounds.count_blocks(same_document, 800, 2) == 2 * sum(s * s for s in sizes)
    assert bounds.count_blocks(causal_document, 800, 1) == sum(s * (s + 1) // 2 for s in sizes)


def test_strides_segments_where_and_minimum_are_followed_exactly():
    def dilated(b, h, q, kv):  # segments of 64 tokens, every 4th key of the query's segment
        return ((q - kv) % 4 == 0) & (q // 64 == kv // 64)

    def mixed(b, h, q, kv):
        return torch.where(q > 500, (q - kv).abs() < 10, kv <= q) | (torch.minimum(q, kv) >= 990)

    n = 1000
    q, kv = torch.arange(n)[:, None], torch.arange(n)[None, :]
    # the truth: every pair evaluated on plain tensors
    assert bounds.count_blocks(dilated, n, 1) == int(dilated(0, 0, q, kv).sum())
    assert bounds.count_blocks(mixed, n, 1) == int(mixed(0, 0, q, kv).sum())


def test_a_mask_bounds_cannot_follow_is_counted_pair_by_pair_where_short_and_refused_where_long():
    def trig(b, h, q, kv):  # the same window, through an operation with no bounds
        return torch.cos((q - kv).float() * 0) * (q - kv).abs() <= 8

    with pytest.raises(bounds.Unbounded, match="float"):
        bounds.count_blocks(trig, 100, 1)
    assert masks.count_pairs(trig, 300, 2) == (2 * window_pairs(300, 8, False), "exact")
    with pytest.raises(masks.CountRefused, match=r"\.float\(\).*N=1,048,576, H=8 needs 8\.8e\+12 evaluations"):
        masks.count_pairs(trig, 1 << 20, 8)  # 2^43 evaluations: refused at once, not run for hours


def test_a_count_past_its_time_limit_stops_and_says_so():
    with bounds.time_limit(0.0), pytest.raises(masks.CountRefused, match="time limit"):
        masks.count_pairs(window(1000), 1 << 16, 1)


@pytest.mark.slow
def test_ten_million_tokens_of_a_causal_window_are_counted_exactly():
    """N^2 H = 8e14 pairs one by one would take days; by tiles the count is the closed form."""
    n, w = 10_000_000, 256
    pairs, how = masks.count_pairs(masks.with_causal(window(w)), n, 8)
    assert (pairs, how) == (8 * window_pairs(n, w, True), "blocks")


# --- counted after the measurement, apart from it ---------------------------------------------


class Counted:
    """An implementation whose pairs are counted from a mask_mod."""

    counted_pairs = True
    pairs_counted = "blocks"

    def __init__(self, mod):
        self.mod = mod

    def useful_pairs(self, n, h, causal):
        mod = masks.with_causal(self.mod) if causal else self.mod
        pairs, self.pairs_counted = masks.count_pairs(mod, n, h)
        return pairs

    def executed_pairs(self, n, h, causal):
        return 3 * self.useful_pairs(n, h, causal)

    def pairs_source(self):
        return None


def test_a_count_gives_useful_and_executed_pairs_and_how():
    got = counting.count(Counted(window(16)), 4096, 2, causal=True)
    assert got == Pairs(2 * window_pairs(4096, 16, True), 6 * window_pairs(4096, 16, True), "blocks")


def test_a_count_that_cannot_finish_is_unknown_with_the_reason():
    got = counting.count(Counted(window(16)), 4096, 2, causal=False, limit_s=0.0)
    assert got.useful is None and got.counted == "unknown" and "time limit (0 s)" in got.unknown
