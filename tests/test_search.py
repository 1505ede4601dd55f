"""Grow-then-bisect against an injected failure threshold."""

import pytest

from attnbench.sweeps.search import grow_then_bisect


def threshold_probe(limit, status="oom"):
    calls = []

    def probe(n, phase):
        calls.append((n, phase))
        return "ok" if n <= limit else status

    return probe, calls


@pytest.mark.parametrize("limit", [1, 1000, 1024, 1025, 4095, 4096, 5000, 70_000, 123_456, 1 << 20])
@pytest.mark.parametrize("granularity", [1, 128, 512])
def test_finds_the_largest_multiple_of_the_granularity(limit, granularity):
    probe, calls = threshold_probe(limit)
    start = granularity * max(1, 1024 // granularity)
    result = grow_then_bisect(probe, start=start, granularity=granularity, max_len=1 << 30)
    assert result.best == limit // granularity * granularity
    assert result.first_failure - result.best <= granularity
    assert result.stop_status == "oom" and result.stopped_by == "memory"
    lengths = [n for n, _ in calls]
    assert all(n % granularity == 0 for n in lengths)
    assert len(lengths) == len(set(lengths)), "no length is tried twice"
    assert len(lengths) <= 2 * (1 << 30).bit_length()


def test_resolution_stops_bisection_early():
    probe, calls = threshold_probe(300_000)
    result = grow_then_bisect(probe, start=4096, granularity=4096, max_len=1 << 30, resolution=65536)
    assert result.best <= 300_000 < result.first_failure
    assert result.first_failure - result.best <= 65536
    assert result.best % 4096 == 0


def test_first_trial_failing_bisects_below_start():
    probe, _ = threshold_probe(300)
    result = grow_then_bisect(probe, start=1024, granularity=128, max_len=1 << 20)
    assert result.best == 256 and result.first_failure == 384


def test_nothing_runs():
    probe, _ = threshold_probe(0, status="time-limit")
    result = grow_then_bisect(probe, start=128, granularity=128, max_len=1 << 20)
    assert result.best == 0 and result.stopped_by == "time"


def test_cap_without_failure():
    probe, calls = threshold_probe(10**9)
    result = grow_then_bisect(probe, start=1024, granularity=1024, max_len=8192)
    assert result.best == 8192 and result.first_failure is None and result.stopped_by == "max-seq-len cap"
    assert [n for n, _ in calls] == [1024, 2048, 4096, 8192]


def test_phases_are_named():
    probe, calls = threshold_probe(5000)
    grow_then_bisect(probe, start=1024, granularity=128, max_len=1 << 20)
    assert [p for _, p in calls][:4] == ["grow"] * 4 and calls[-1][1] == "bisect"


def test_start_must_be_on_the_grid():
    with pytest.raises(ValueError):
        grow_then_bisect(lambda n, p: "ok", start=1000, granularity=128, max_len=1 << 20)
