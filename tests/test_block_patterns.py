"""Block patterns: the compact lists against literal transcriptions of each rule, and the
properties docs/design/semantics.md asks for (diagonal, kept fraction, determinism, causal, compactness)."""

from pathlib import Path

import pytest
import torch

from attnbench.errors import ConfigError
from attnbench.masks import PATTERN_TYPES
from attnbench.masks.block_lists import expand_progressions
from attnbench.masks.patterns import build_pattern
from attnbench.measure.memory import current_rss_bytes

CAUSAL = [False, True]


# --- the rules, one (query block, key block) pair at a time -------------------------------


def window_start(i, nb, w, causal):
    return max(0, i - w + 1) if causal else min(max(i - (w - 1) // 2, 0), nb - w)


def kept_by_rule(pattern_type, shape, nb, causal, i, j):
    if causal and j > i:
        return False
    if pattern_type in ("local_window", "global_local"):
        w = shape["window"]
        g = shape.get("global_blocks", 0)
        if i < g or j < g:
            return True
        start = window_start(i, nb, w, causal)
        return start <= j < start + w
    for w, r in zip(shape["segment_blocks"], shape["dilation_rates"]):
        same_segment = i // w == j // w
        on_grid = (j - i) % r == 0 if pattern_type == "dilated_sparse" else j % r == 0
        if same_segment and on_grid:
            return True
    return False


def mask_by_rule(p):
    nb = p.num_blocks
    return torch.tensor(
        [[kept_by_rule(p.pattern_type, p.shape, nb, p.causal, i, j) for j in range(nb)] for i in range(nb)]
    )


def fits(kept, target, nb):
    return abs(kept - target) <= 0.2 * target or abs(kept - target) <= nb


@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("nb,ratio", [(16, 0.25), (32, 0.1), (64, 0.05), (96, 0.3), (200, 0.02), (7, 1.0)])
def test_lists_follow_the_rule(pattern_type, causal, nb, ratio):
    p = build_pattern(pattern_type, nb, ratio, causal)
    expected = mask_by_rule(p)
    assert torch.equal(p.dense(), expected)
    assert p.kept_blocks == int(expected.sum())  # the closed-form count
    assert torch.equal(p.row_counts, expected.sum(dim=1))


@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize(
    "nb,ratio",
    [(nb, r) for nb in (16, 64, 512) for r in (0.01, 0.02, 0.05, 0.1, 0.25, 1.0)] + [(2048, 0.01), (2048, 0.05)],
)
def test_pattern_properties(pattern_type, causal, nb, ratio):
    p = build_pattern(pattern_type, nb, ratio, causal)
    allowed = nb * (nb + 1) // 2 if causal else nb * nb
    assert fits(p.kept_blocks, ratio * allowed, nb), (p.kept_fraction, p.describe())
    idx, counts = p.expand(0, nb)
    kept = torch.arange(idx.shape[1])[None, :] < counts[:, None]
    rows = torch.arange(nb)[:, None].expand_as(idx)
    assert ((idx == rows) & kept).any(dim=1).all(), "every row keeps its diagonal block"
    if causal:
        assert not ((idx > rows) & kept).any(), "no block above the diagonal"
    # the progressions of a row are disjoint and ascending: the explicit row has no repeats
    assert (idx[:, 1:] > idx[:, :-1])[kept[:, 1:]].all()
    again = build_pattern(pattern_type, nb, ratio, causal)
    assert torch.equal(p.progressions, again.progressions) and p.shape == again.shape


def test_kept_fraction_lands_within_20_percent_once_rows_are_long():
    for pattern_type in PATTERN_TYPES:
        for causal in CAUSAL:
            for ratio in (0.01, 0.02, 0.05):
                p = build_pattern(pattern_type, 4096, ratio, causal)
                assert abs(p.kept_fraction - ratio) <= 0.2 * ratio, (pattern_type, causal, ratio, p.kept_fraction)


def test_expand_gives_each_row_and_can_drop_the_diagonal():
    p = build_pattern("dilated_sparse", 64, 0.1, causal=True)
    dense = p.dense()
    idx, counts = p.expand(10, 30, width=64)
    assert idx.shape == (20, 64)
    for r in range(20):
        assert sorted(idx[r, : counts[r]].tolist()) == torch.nonzero(dense[10 + r]).flatten().tolist()
    idx, counts = p.expand(10, 30, drop_diagonal=True)
    for r in range(20):
        assert idx[r, : counts[r]].tolist() == [
            j for j in torch.nonzero(dense[10 + r]).flatten().tolist() if j != 10 + r
        ]


def test_expand_progressions_by_hand():
    prog = torch.tensor([[[0, 10, 3], [20, 21, 1]], [[5, 5, 1], [7, 12, 2]]])
    idx, counts = expand_progressions(prog, width=6)
    assert counts.tolist() == [5, 3]
    assert idx.tolist() == [[0, 3, 6, 9, 20, 0], [7, 9, 11, 0, 0, 0]]


# --- given segment lengths and dilation rates ----------------------------------------------


@pytest.mark.parametrize("causal", CAUSAL)
def test_given_scales_are_used_and_rates_sized(causal):
    # the seeds' shape: segments of 64K and 128K tokens, dilation 1 and 2, at 128K / 256-token blocks
    p = build_pattern("dilated_sparse", 512, 0.02, causal, segment_blocks=[256, 512], dilation_rates=[1, 2])
    c = p.shape["dilation_rates"][0]
    assert p.shape == {"segment_blocks": [256, 512], "dilation_rates": [c, 2 * c]} and c > 1
    assert torch.equal(p.dense(), mask_by_rule(p))
    assert fits(p.kept_blocks, 0.02 * p.allowed_blocks, 512)
    # hierarchical keeps its first segment whole: the rates of the outer levels are sized
    p = build_pattern("hierarchical", 512, 0.05, causal, segment_blocks=[8, 64, 512])
    c = p.shape["dilation_rates"][1] // 8
    assert p.shape == {"segment_blocks": [8, 64, 512], "dilation_rates": [1, 8 * c, 64 * c]}
    assert torch.equal(p.dense(), mask_by_rule(p))
    assert fits(p.kept_blocks, 0.05 * p.allowed_blocks, 512)
    # ... so a first segment of half the sequence cannot keep 2%
    with pytest.raises(ConfigError, match="not within 20%"):
        build_pattern("hierarchical", 512, 0.02, causal, segment_blocks=[256, 512])


@pytest.mark.parametrize("pattern_type", ["dilated_sparse", "hierarchical"])
def test_given_rates_alone_size_the_segments(pattern_type):
    p = build_pattern(pattern_type, 256, 0.1, False, dilation_rates=[1, 2, 4])
    m = p.shape["segment_blocks"][0]
    assert p.shape == {"segment_blocks": [m, 2 * m, 4 * m], "dilation_rates": [1, 2, 4]}
    assert torch.equal(p.dense(), mask_by_rule(p))


@pytest.mark.parametrize(
    "kwargs,hint",
    [
        ({"segment_blocks": [8, 12]}, "divide the next"),
        ({"segment_blocks": [8, 16], "dilation_rates": [2, 3]}, "divide the next"),
        ({"segment_blocks": [8, 16], "dilation_rates": [1]}, "one dilation rate per segment"),
        ({"segment_blocks": [48]}, "does not divide"),
        ({"dilation_rates": [2, 4], "pattern_type": "hierarchical"}, "first dilation rate must be 1"),
        ({"segment_blocks": [2, 4], "ratio": 0.5}, "not within 20%"),
        ({"segment_blocks": [8], "pattern_type": "local_window"}, "takes no segment_lengths"),
        ({"ratio": 0.0}, "(0, 1]"),
        ({"ratio": 1.5}, "(0, 1]"),
        ({"pattern_type": "banded"}, "unknown pattern type"),
    ],
)
def test_parameters_that_do_not_fit_are_refused(kwargs, hint):
    kwargs = dict(kwargs)
    pattern_type = kwargs.pop("pattern_type", "dilated_sparse")
    ratio = kwargs.pop("ratio", 0.1)
    with pytest.raises(ConfigError, match=hint.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        build_pattern(pattern_type, 64, ratio, False, **kwargs)


# --- compact at large N --------------------------------------------------------------------


def _hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
def test_16m_tokens_build_from_compact_lists(pattern_type):
    nb = (16 << 20) // 128  # N = 16M, 128-token blocks: 131,072 query blocks
    Path("/proc/self/clear_refs").write_text("5")
    base = current_rss_bytes()
    p = build_pattern(pattern_type, nb, 0.05, causal=False)
    grown = _hwm() - base
    assert grown < 1 << 30, f"building grew the resident set by {grown / 2**20:.0f} MiB"
    assert p.progressions.numel() * 8 < 64 << 20  # a few progressions per row, not ~6,500 blocks
    assert abs(p.kept_fraction - 0.05) <= 0.01
    assert p.kept_blocks > 800_000_000  # ~860M block pairs are described, none listed
