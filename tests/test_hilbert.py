"""The Hilbert order is a true permutation, round-trips, and has the Hilbert curve's defining
properties (checked from the grid, not from the code's own output); the Hilbert variant of
dilated attention has the key sets docs/design/semantics.md defines."""

import pytest
import torch

from attnbench import impls
from attnbench.errors import ConfigError
from attnbench.masks.hilbert import curve_order, grid_shape, inverse, tile_side

# (length, grid width): squares, rectangles of several squares, widths given, odd grids
GRIDS = [
    (1, 0),
    (4, 0),
    (16, 0),
    (64, 0),
    (4096, 0),
    (2 * 4**5, 0),
    (3 * 4**4, 0),
    (7, 0),
    (96, 0),
    (48, 8),
    (256, 16),
    (12, 4),
    (4096, 32),
    (1 << 20, 0),
]


@pytest.mark.parametrize("n,width", GRIDS)
def test_order_is_a_permutation_and_round_trips(n, width):
    order = curve_order(n, width)
    assert order.shape == (n,)
    assert torch.equal(torch.sort(order).values, torch.arange(n))  # every position exactly once
    pi = inverse(order)
    assert torch.equal(order[pi], torch.arange(n)) and torch.equal(pi[order], torch.arange(n))
    x = torch.randn(2, n, 3)
    curve = x[:, order]
    assert torch.equal(torch.empty_like(curve).index_copy_(1, order, curve), x)  # back to the original order


def test_auto_grid_is_square_for_powers_of_four_and_tiles_otherwise():
    assert grid_shape(4096) == (64, 64)
    assert grid_shape(2 * 4096) == (64, 128)
    assert grid_shape(3 * 1024) == (32, 96)
    assert grid_shape(7) == (1, 7)
    assert grid_shape(48, 8) == (6, 8) and tile_side(6, 8) == 2


def cells(order: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    return order // cols, order % cols


@pytest.mark.parametrize("side", [2, 4, 8, 16, 32, 64])
def test_square_grid_is_a_continuous_quadtree_curve(side):
    """A Hilbert curve starts in a corner, moves to a grid neighbour at every step, and
    each aligned run of 4^j positions fills an aligned 2^j x 2^j square."""
    row, col = cells(curve_order(side * side), side)
    assert (row[0].item(), col[0].item()) == (0, 0)
    assert torch.all((row.diff().abs() + col.diff().abs()) == 1)
    j = 1
    while 4**j <= side * side:
        r, c = row.view(-1, 4**j), col.view(-1, 4**j)
        sq = 2**j
        assert torch.all(r.max(1).values - r.min(1).values == sq - 1) and torch.all(
            c.max(1).values - c.min(1).values == sq - 1
        )
        assert torch.all(r.min(1).values % sq == 0) and torch.all(c.min(1).values % sq == 0)
        j += 1


def test_two_by_two_by_hand():
    # (0,0) -> (1,0) -> (1,1) -> (0,1) as (row, col): row-major indices 0, 2, 3, 1
    assert curve_order(4).tolist() == [0, 2, 3, 1]


def test_tiled_grid_visits_each_tile_as_one_curve():
    rows, cols = grid_shape(96)  # 4 x 24: six 4 x 4 tiles
    row, col = cells(curve_order(96), cols)
    for t in range(6):
        r, c = row[16 * t : 16 * (t + 1)], col[16 * t : 16 * (t + 1)]
        assert set(zip(r.tolist(), c.tolist())) == {(i, 4 * t + j) for i in range(4) for j in range(4)}
        assert torch.all((r.diff().abs() + c.diff().abs()) == 1)


def test_a_grid_the_length_cannot_form_is_a_config_error():
    with pytest.raises(ConfigError, match="grid of width 100"):
        curve_order(256, 100)
    with pytest.raises(ConfigError, match="multiple of 100"):
        impls.build("dilated", segment_lengths=[16], dilation_rates=[1], hilbert=True, grid_width=100).check_shape(
            256, 4
        )
    impl = impls.build("ring-dilated-hilbert", segment_lengths=[16], dilation_rates=[1], grid_width=100)
    impl.world_size = 2
    with pytest.raises(ConfigError, match="grid of width 100"):
        impl.check_shape(256, 4)


def test_hilbert_dilated_key_sets_follow_the_definition():
    """docs/design/semantics.md, literally: u in M(t) iff pi(u) in M_pattern(pi(t))."""
    n, heads = 64, 3
    plain = impls.build("dilated", segment_lengths=[8, 16], dilation_rates=[1, 2])
    curved = impls.build("dilated", segment_lengths=[8, 16], dilation_rates=[1, 2], hilbert=True)
    pattern = plain.key_mask(n, heads)
    pi = inverse(curve_order(n))
    expected = torch.zeros(heads, n, n, dtype=torch.bool)
    for h in range(heads):
        for t in range(n):
            for u in range(n):
                expected[h, t, u] = pattern[h, pi[t], pi[u]]
    assert torch.equal(curved.key_mask(n, heads), expected)
    assert curved.useful_pairs(n, heads, False) == int(expected.sum())


def test_hilbert_ordering_rejects_causal():
    curved = impls.build("dilated", segment_lengths=[16], dilation_rates=[1], hilbert=True)
    q = torch.randn(1, 16, 2, 8)
    with pytest.raises(ConfigError, match="non-causal"):
        curved(q, q, q, is_causal=True)
    assert not curved.supports_causal
    assert impls.build("dilated", segment_lengths=[16], dilation_rates=[1]).supports_causal
