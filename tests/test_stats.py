"""The interval arithmetic: coverage against known truths, hand-computed values."""

import numpy as np
import pytest

from attnbench.measure import stats
from attnbench.measure.stats import (
    Interval,
    anomalous_efficiency,
    holm,
    median_interval,
    plus_minus,
    ratio_interval,
    ratio_p_value,
    scaled,
)


def test_median_interval_covers_the_true_median_about_95_percent_of_the_time():
    # lognormal(0, 0.05) has median exactly 1.0
    covered = 0
    for seed in range(200):
        x = np.random.default_rng(seed).lognormal(0.0, 0.05, 20)
        iv = median_interval(list(x), resamples=1000)
        covered += iv.low <= 1.0 <= iv.high
    assert 0.85 <= covered / 200 <= 0.995


def test_interval_of_constant_samples_is_the_value_and_is_reproducible():
    iv = median_interval([4.0] * 10)
    assert (iv.value, iv.low, iv.high, iv.n) == (4.0, 4.0, 4.0, 10)
    x = list(np.random.default_rng(1).normal(10, 1, 15))
    assert median_interval(x) == median_interval(x)
    assert median_interval([]) is None


def test_ratio_of_constant_sets_is_exact():
    iv = ratio_interval([2.0] * 8, [8.0] * 5)
    assert (iv.value, iv.low, iv.high, iv.n) == (0.25, 0.25, 0.25, 5)


def test_ratio_interval_covers_a_known_speedup():
    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        slow, fast = rng.lognormal(np.log(3.0), 0.05, 20), rng.lognormal(0.0, 0.05, 20)
        iv = ratio_interval(list(slow), list(fast), resamples=1000)
        covered += iv.low <= 3.0 <= iv.high
    assert covered >= 85


def test_process_to_process_spread_widens_the_interval():
    rng = np.random.default_rng(3)
    offsets = [0.9, 1.0, 1.1]
    groups = [list(o * rng.lognormal(0, 0.005, 20)) for o in offsets]
    pooled = median_interval([x for g in groups for x in g])
    hierarchical = median_interval(groups)
    assert hierarchical.n == pooled.n == 60
    assert hierarchical.high - hierarchical.low > 3 * (pooled.high - pooled.low)


def test_scaled_turns_a_time_into_a_rate_and_swaps_the_bounds():
    iv = scaled(Interval(2.0, 1.0, 4.0, 9), 8.0)
    assert (iv.value, iv.low, iv.high, iv.n) == (4.0, 2.0, 8.0, 9)


def test_holm_by_hand():
    # sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: stop
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.04, 0.04], 0.05) == [False, False]
    assert holm([], 0.05) == []


def test_bootstrap_p_value():
    same = list(np.random.default_rng(0).normal(10, 0.2, 20))
    assert ratio_p_value(same, same) == 1.0
    assert ratio_p_value(
        [11.0 + 0.01 * i for i in range(10)], [10.0 + 0.01 * i for i in range(10)], resamples=999
    ) == pytest.approx(2 / 1000)


def test_anomalous_efficiency_is_above_one_beyond_its_interval():
    assert anomalous_efficiency(Interval(1.05, 1.01, 1.09, 10))
    assert not anomalous_efficiency(Interval(1.03, 0.98, 1.08, 10))


def test_plus_minus():
    assert plus_minus(Interval(19.1, 18.8, 19.4, 20), unit="ms") == "19.1 ms ±0.3 (n=20)"
    assert plus_minus(Interval(1.48, 0.91, 2.05, 6), with_n=False) == "1.48 ±0.57"
    assert plus_minus(Interval(111.0, 110.6, 111.4, 5), lambda x: f"{x:.3g}", "ms") == "111 ms ±0.4 (n=5)"
    assert plus_minus(Interval(4689.0, 4689.0, 4689.0, 1), lambda x: f"{x:,.0f}", "ms") == "4,689 ms (n=1)"
    assert plus_minus(None) == "–"


def test_an_interval_far_from_symmetric_is_printed_as_its_ends():
    """One side 90 times the other (a few samples, one slow call): the ends, not a ±."""
    from attnbench.measure.stats import Interval, plus_minus

    fmt = lambda x: f"{x:.3g}"  # noqa: E731
    assert plus_minus(Interval(0.55, 0.5, 45.0, 3), fmt, "ms") == "0.55 ms [0.5, 45] (n=3)"
    assert plus_minus(Interval(19.1, 18.8, 19.4, 20), fmt, "ms") == "19.1 ms ±0.3 (n=20)"


def test_a_ratio_from_each_sides_own_medians_is_the_ratio_drawn_in_one_stream():
    """A caller may give a ratio the resampled medians of each side (``flat_medians``, or its
    memo of them: a baseline is the numerator of many ratios): the interval is the one drawn
    in one seeded stream, numerator then denominator, for any sample counts, integer samples
    included; and ``median_interval`` from the stream's start alike."""
    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 6, 10, 31):
        for m in (1, 2, 5, 30):
            num, den = list(rng.lognormal(0, 0.3, n)), [int(x) for x in rng.integers(1, 9, m)]
            assert ratio_interval(num, den, medians=stats.flat_medians) == ratio_interval(num, den)
            assert median_interval(num, medians=stats.flat_medians) == median_interval(num)


def test_the_report_draws_a_baseline_once_for_all_its_ratios(monkeypatch):
    """The report's memo: one baseline against three rows draws the baseline's medians once
    and each row's once, and gives each pair the interval of ``ratio_interval``."""
    from types import SimpleNamespace

    from attnbench.report import intervals

    rng = np.random.default_rng(12)
    base = SimpleNamespace(times_ms=list(rng.lognormal(1, 0.2, 10)), gpu_times_ms=None)
    rows = [SimpleNamespace(times_ms=list(rng.lognormal(0, 0.2, 10)), gpu_times_ms=None) for _ in range(3)]
    drawn = []
    real = stats.flat_medians

    def counted(samples, after=0, *args):
        drawn.append((id(samples), after))
        return real(samples, after, *args)

    monkeypatch.setattr(intervals, "_MEDIANS", {})
    monkeypatch.setattr(intervals, "_RATIOS", {})
    monkeypatch.setattr(stats, "flat_medians", counted)
    found = [intervals.speedup_interval(base, r, "eager")[0] for r in rows]
    assert found == [ratio_interval(base.times_ms, r.times_ms) for r in rows]
    assert drawn.count((id(base.times_ms), 0)) == 1 and len(drawn) == 4
