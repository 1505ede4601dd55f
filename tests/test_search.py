"""Grow-then-bisect against an injected failure threshold."""

from dataclasses import replace

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


# --- the predicted search --------------------------------------------------------------------

from attnbench.sweeps.search import (  # noqa: E402
    CONFIRMATION_FAILURES,
    DEFAULT_RELATIVE_RESOLUTION,
    PREDICTED,
    Limits,
    Outcome,
    predicted_search,
)


class Device:
    """A device with a known memory law and call time: a length runs when its peak fits the
    budget and its call the time limit; every probe is recorded."""

    def __init__(self, peak, budget, time_ms=lambda n: 1.0, limit_ms=None, flops=None):
        self.peak, self.budget, self.time_ms, self.limit_ms, self.flops = peak, budget, time_ms, limit_ms, flops
        self.calls = []  # (length, phase, attempt, prediction)

    def runs(self, n):
        if self.peak(n) > self.budget:
            return "oom"
        return "time-limit" if self.limit_ms and self.time_ms(n) > self.limit_ms else "ok"

    def __call__(self, n, phase, attempt, prediction):
        self.calls.append((n, phase, attempt, prediction))
        if phase == PREDICTED:
            return Outcome("time-limit")
        status = self.runs(n)
        if status != "ok":
            return Outcome(status)
        flops = self.flops(n) if self.flops else None
        return Outcome("ok", float(self.peak(n)), self.time_ms(n), flops, float(self.budget))

    def truth(self, start, grid, max_len):
        """The largest length on the grid that runs (the blind search's answer at granularity):
        peak and time grow with the length, so a bisection over the grid finds it exactly."""
        lo, hi = 1, max_len // grid
        assert self.runs(lo * grid) == "ok"
        if self.runs(hi * grid) == "ok":
            return hi * grid
        while hi - lo > 1:  # runs at lo, fails at hi
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.runs(mid * grid) == "ok" else (lo, mid)
        return lo * grid


def linear(n):  # 2.3 KiB per token on 5 MB: dilated on the CPU
    return 5e6 + 2330 * n


def quadratic(n):  # scores and probabilities of 4 heads in fp32, on 70 MB
    return 7e7 + 32 * n * n


@pytest.mark.parametrize(
    "law,degree,budget,start,resolution",
    [
        (linear, 1, 2**30, 1024, 16384),
        (linear, 1, 80 * 2**30, 65536, 262144),
        (linear, 1, 64 * 2**20, 16384, 32768),
        (quadratic, 2, 2**30, 1024, 256),
        (quadratic, 2, 140 * 2**30, 4096, 1024),
    ],
)
def test_the_predicted_search_finds_the_limit_within_the_resolution_in_few_trials(
    law, degree, budget, start, resolution
):
    device = Device(law, budget)
    lim = Limits(start=start, granularity=512, max_len=1 << 31, resolution=resolution, degree=degree)
    result = predicted_search(device, lim)
    truth = device.truth(start, 512, 1 << 31)
    assert result.best <= truth < result.first_failure
    assert result.first_failure - result.best <= lim.gap and result.margin == result.first_failure - result.best
    assert result.stop_status == "oom" and result.confirmed
    blind = grow_then_bisect(lambda n, p: device.runs(n), start, 512, 1 << 31, resolution)
    assert abs(result.best - blind.best) <= lim.gap
    # two or three short trials to fit (a quadratic needs three), a jump, a step, the confirmation
    assert len(result.tried) <= 5 + degree and len(result.tried) <= len(blind.tried) + 1
    lengths = [n for n, _ in result.tried]
    assert lengths.count(result.best) == 2 and all(lengths.count(n) == 1 for n in lengths if n != result.best)
    assert device.calls[-1][:3] == (result.best, "confirm", 2)


def test_every_probe_carries_what_the_model_predicted_for_it():
    device = Device(linear, 2**30)
    predicted_search(device, Limits(start=1024, granularity=512, max_len=1 << 31, resolution=16384))
    modelled = [(n, p) for n, _, _, p in device.calls if p and p.peak_bytes]
    assert len(modelled) >= 3
    for n, p in modelled:  # a linear law is fitted exactly: the prediction is the truth
        assert p.peak_bytes == pytest.approx(linear(n), rel=1e-6) and p.max_seq > 0


def test_a_kill_is_retried_once_and_an_expected_oom_is_not():
    killed = set()

    def probe(n, phase, attempt, prediction):
        if n == 2048 and attempt == 1:
            killed.add(n)
            return Outcome("killed")
        return Device(linear, 2**30)(n, phase, attempt, prediction)

    result = predicted_search(probe, Limits(start=1024, granularity=512, max_len=1 << 31, resolution=16384))
    statuses = {n: [s for m, s in result.tried if m == n] for n, _ in result.tried}
    assert statuses[2048] == ["killed", "ok"]
    assert all(s == ["oom"] for n, s in statuses.items() if n > result.best), "a failure above a success runs once"


def test_an_oom_where_the_model_saw_plenty_of_room_runs_once_more():
    """The probes report twice the memory there is (an overhead misread): the first jump fails
    as the model could not know; the bisection below it runs where the model predicts half the
    budget, so an OOM there is a contradiction and runs once more."""
    device = Device(linear, 2**30)
    injected = []

    def probe(n, phase, attempt, prediction):
        out = device(n, phase, attempt, prediction)
        if phase == "bisect" and not injected:
            injected.append(n)
            assert prediction.peak_bytes < 0.8 * 2**31
            return Outcome("oom")
        return Outcome(out.status, out.peak_bytes, out.time_ms, out.flops, 2.0 * 2**30) if out.status == "ok" else out

    result = predicted_search(probe, Limits(start=1024, granularity=512, max_len=1 << 31, resolution=16384))
    assert injected and [s for n, s in result.tried if n == injected[0]] == ["oom", "ok"]
    assert result.best <= device.truth(1024, 512, 1 << 31) < result.first_failure


def test_a_length_predicted_over_the_time_limit_is_recorded_not_run():
    # quadratic time (a fused kernel on the CPU), memory that never binds: the time limit stops it
    device = Device(linear, 2**40, time_ms=lambda n: 1.2e-5 * n * n, limit_ms=5000.0, flops=lambda n: 4.0 * n * n)
    lim = Limits(start=1024, granularity=512, max_len=1 << 31, resolution=8192, degree=1, time_limit_ms=5000.0)
    result = predicted_search(device, lim)
    truth = max(n for n in range(512, 1 << 20, 512) if device.time_ms(n) <= 5000)
    assert result.best <= truth < result.first_failure and result.stopped_by == "time"
    assert result.first_failure - result.best <= 8192 and len(result.tried) <= 5
    # 16K runs in 3.2 s; the bracket's upper end, 24K, would take 7.2 s: recorded, not run
    assert (result.first_failure, PREDICTED) in [(n, phase) for n, phase, _, _ in device.calls]
    assert result.failure_predicted
    assert all(device.time_ms(n) <= 5000 for n, phase, _, _ in device.calls if phase != PREDICTED)


def test_a_confirmation_that_fails_moves_the_limit_below_it():
    runs = {}

    def probe(n, phase, attempt, prediction):
        runs[n] = runs.get(n, 0) + 1
        if phase == "confirm" and runs[n] == 2 and not runs.get("failed"):
            runs["failed"] = True
            return Outcome("oom")  # the edge is noisy: the second run of the largest success fails
        return Device(linear, 2**30)(n, phase, attempt, prediction)

    result = predicted_search(probe, Limits(start=1024, granularity=512, max_len=1 << 31, resolution=16384))
    first_best = next(n for n, s in result.tried if s == "oom" and runs.get(n, 0) >= 2)
    assert result.confirmed and result.best < first_best and result.first_failure <= first_best


class NoisyEdge(Device):
    """A fresh process holds 2.5% less than the first process at a length: a confirmation
    fails anywhere within 2.5% under the first process's limit (a CPU's address space under
    its cap, measured: a length ran at 268 MB in one process and failed at 262 MB in the next)."""

    def runs_in_a_fresh_process(self, n):
        return self.runs(n) if self.peak(n) <= 0.975 * self.budget else "oom"

    def __call__(self, n, phase, attempt, prediction):
        if phase == "confirm":
            self.calls.append((n, phase, attempt, prediction))
            status = self.runs_in_a_fresh_process(n)
            return (
                Outcome(status, float(self.peak(n)), 1.0, None, float(self.budget))
                if status == "ok"
                else Outcome(status)
            )
        return super().__call__(n, phase, attempt, prediction)


def test_a_search_whose_confirmations_keep_failing_retreats_below_the_noisy_edge():
    """Two failed confirmations one resolution apart ended the search unconfirmed on an older
    success far below the edge (on a CPU under load: 32K, where 126K runs in any process); it
    now goes on below the edge and confirms a length there."""
    device = NoisyEdge(linear, 256 * 2**20)
    lim = Limits(start=16384, granularity=16, max_len=1 << 31, relative=DEFAULT_RELATIVE_RESOLUTION)
    result = predicted_search(device, lim)
    assert result.confirmed
    assert device.runs_in_a_fresh_process(result.best) == "ok"
    assert result.best >= 0.95 * device.truth(16384, 16, 1 << 31)  # within the noise and a few resolutions of it
    assert sum(phase == "confirm" for _, phase, _, _ in device.calls) <= CONFIRMATION_FAILURES


def test_replaying_recorded_outcomes_repeats_the_search():
    device = Device(quadratic, 2**30)
    lim = Limits(start=1024, granularity=512, max_len=1 << 31, resolution=256, degree=2)
    first = predicted_search(device, lim)
    recorded = {(n, a): device(n, p, a, None) for n, p, a, _ in list(device.calls)}
    again = predicted_search(lambda n, p, a, pred: recorded[(n, a)], lim)
    assert again.tried == first.tried and again.best == first.best


def test_the_predicted_search_stops_at_the_cap():
    device = Device(linear, 2**40)
    result = predicted_search(device, Limits(start=1024, granularity=1024, max_len=8192))
    assert result.best == 8192 and result.first_failure is None and result.stopped_by == "max-seq-len cap"


def test_where_memory_binds_time_alone_never_sets_the_jump():
    """Two short successes give a time model but not a quadratic memory fit (three lengths):
    the search grows instead of jumping to where the time limit would be."""
    device = Device(quadratic, 2**30, time_ms=lambda n: 1e-5 * n * n, limit_ms=60000.0)
    lim = Limits(start=1024, granularity=512, max_len=1 << 31, resolution=1024, degree=2, time_limit_ms=60000.0)
    result = predicted_search(device, lim)
    assert [n for n, _ in result.tried[:3]] == [1024, 2048, 4096]
    assert result.best <= device.truth(1024, 512, 1 << 31) < result.first_failure


class EarlyOom(Device):
    """Peaks as the fit sees them (quadratic), but the allocator fails above ``true_max``
    (fragmentation, say): the model puts the limit above the failures."""

    true_max = 2400

    def runs(self, n):
        return "oom" if n > self.true_max else super().runs(n)


def test_a_failure_the_model_put_below_its_limit_is_bracketed_one_resolution_under():
    device = EarlyOom(quadratic, 350_000_000)
    lim = Limits(start=512, granularity=128, max_len=1 << 31, resolution=256, degree=2)
    result = predicted_search(device, lim)
    # 2560 failed where the fit put the limit near 2958; once 1792 ran, 2560 is within twice
    # the largest success: the next probe is 2560 - 256, where a bisection would take 2176
    lengths = [n for n, _ in result.tried]
    assert lengths[: lengths.index(1792) + 2] == [512, 1024, 2560, 1792, 2304]
    assert (result.best, result.first_failure) == (2304, 2560) and len(result.tried) <= 6


class LowModel(Device):
    """A CPU under an address-space cap: each success reports the cap as its budget, but the
    allocation fails ``slack`` beyond it (memory mapped before the trial is not counted), so the
    model puts the limit a little below where it is, every time."""

    slack = 1.012

    def runs(self, n):
        return "oom" if self.peak(n) > self.slack * self.budget else "ok"


def dilated_on_a_cpu(n):  # 1.07x its floor of 512 bytes a token, on 15 MB
    return 1.5e7 + 548 * n


@pytest.mark.parametrize("law,degree,budget,start", [(dilated_on_a_cpu, 1, 2**30, 4096), (quadratic, 2, 2**28, 1024)])
def test_a_model_that_is_always_a_little_low_is_bracketed_then_bisected_not_crept_up_on(law, degree, budget, start):
    """The default resolution (1% of the answer): at most 8 trials, confirmation included, for
    the answer a blind doubling search finds at that resolution."""
    device = LowModel(law, budget)
    lim = Limits(start=start, granularity=512, max_len=1 << 31, degree=degree, relative=0.01)
    result = predicted_search(device, lim)
    truth = device.truth(start, 512, 1 << 31)
    assert result.best <= truth < result.first_failure and result.confirmed
    assert result.first_failure - result.best <= lim.gap_at(result.best)
    assert len(result.tried) <= 8, result.tried
    blind = grow_then_bisect(lambda n, p: device.runs(n), start, 512, 1 << 31, lim.gap_at(result.best))
    assert abs(result.best - blind.best) <= lim.gap_at(result.best)
    assert len(result.tried) < len(blind.tried)


def test_a_search_starts_no_trial_once_its_time_budget_is_spent():
    """Each trial takes 60 s of a clock the probes advance (no real time passes): under a 300 s
    budget five trials start, the sixth does not, and the answer is the largest success so far,
    unconfirmed, stopped by the budget. With room to spare the budget changes nothing."""
    clock = [0.0]

    def timed(device):
        def probe(n, phase, attempt, prediction):
            clock[0] += 60.0
            return device(n, phase, attempt, prediction)

        return probe

    device = LowModel(dilated_on_a_cpu, 2**30)
    budgeted = Limits(start=4096, granularity=512, max_len=1 << 31, relative=0.01, budget_s=300.0)
    result = predicted_search(timed(device), budgeted, clock=lambda: clock[0])
    assert len(result.tried) == 5 and result.stop_status == "budget" and result.stopped_by == "search time budget"
    assert result.best == max(n for n, s in result.tried if s == "ok") and not result.confirmed

    unbounded = predicted_search(LowModel(dilated_on_a_cpu, 2**30), replace(budgeted, budget_s=None))
    clock[0] = 0.0
    roomy = predicted_search(
        timed(LowModel(dilated_on_a_cpu, 2**30)), replace(budgeted, budget_s=1e6), lambda: clock[0]
    )
    assert roomy.tried == unbounded.tried and roomy.stop_status == "oom" and roomy.confirmed


class FixedCostsFirst(LowModel):
    """dilated on a CPU as measured: at 4K and 8K the resident set is the process's fixed costs,
    14.0 and 14.5 MiB, whose slope (128 bytes a token) is a quarter of the floor's."""

    def __call__(self, n, phase, attempt, prediction):
        out = super().__call__(n, phase, attempt, prediction)
        if out.status != "ok":
            return out
        peak = 14.0 * 2**20 + 128 * (n - 4096) if n <= 8192 else out.peak_bytes
        return Outcome("ok", float(peak), out.time_ms, out.flops, out.budget, floor_bytes=512.0 * n)


def test_a_fit_below_the_floors_slope_never_sends_the_first_jump_past_where_the_inputs_fit():
    device = FixedCostsFirst(dilated_on_a_cpu, 2**30)
    lim = Limits(start=4096, granularity=4096, max_len=1 << 31, relative=0.01)
    result = predicted_search(device, lim)
    truth = device.truth(4096, 4096, 1 << 31)
    assert result.best <= truth < result.first_failure and result.confirmed
    assert all(n <= 2**30 / 512 for n, _ in result.tried), result.tried  # 1 GiB holds 2M tokens of floor
    assert len(result.tried) <= 8, result.tried


def test_no_trial_starts_that_the_model_expects_to_end_past_the_budget():
    """Calls of 1 ms per 40 tokens; a trial is two calls of the clock the probes advance. The
    search stops where its next trial would end past 300 s: it ends within its budget."""
    clock = [0.0]
    device = LowModel(dilated_on_a_cpu, 2**30, time_ms=lambda n: n / 40, limit_ms=60_000.0, flops=lambda n: 1e3 * n)

    def probe(n, phase, attempt, prediction):
        out = device(n, phase, attempt, prediction)
        clock[0] += 2 * min(device.time_ms(n), 60_000.0) / 1e3
        return out

    lim = Limits(start=4096, granularity=512, max_len=1 << 31, relative=0.01, time_limit_ms=60_000.0, budget_s=300.0)
    result = predicted_search(probe, lim, clock=lambda: clock[0])
    assert result.stop_status == "budget" and 0 < clock[0] <= 300.0
    assert result.best == max(n for n, s in result.tried if s == "ok")
