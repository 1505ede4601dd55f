"""The max-seq search: the largest sequence length a series runs, predicted before it is probed.

``predicted_search`` doubles from ``start`` until it has enough successful trials to fit the
implementation's memory (``attnbench.measure.capacity``: linear or quadratic in N) and the time
of a call, then jumps to just below the length the fits predict the limit at, brackets the
limit from there and bisects inside the bracket, every probe on the grid of the resolution
(so a small change in a measured peak does not move the lengths probed). It falls back to
doubling or bisection wherever the fit is missing or the last guess it made failed; when a
guess failed where the fit put the limit above it, the next probe is one resolution under the
failure (the limit is just below it) where that guess was within twice the largest success,
and bisection alone after a second miss. A length
whose predicted time is far over the per-call limit is not run: it is recorded as predicted.

Failures are run once: a failure above the largest success is what the search expects of a
limit. One that contradicts what is known (a crash, a kill, an out-of-memory or time-limit
where the model predicted plenty of room) runs once more in a fresh process. The largest
success is confirmed by a second run in a fresh process; if that fails the limit is below it,
by more than the resolution (the edge moves from process to process): the search goes on
under a ceiling two resolutions below the failure, four after a second failure, and stops at
a third.

Pure: trials come from the ``probe`` callable, so the search is tested against injected
limits. ``grow_then_bisect`` is the search without a model (the reference it is tested
against).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from attnbench.measure.capacity import TimeModel, fit_leading, fit_time, memory_model
from attnbench.results import BUDGET

# The first jump from fits of short trials stays this far below the predicted limit; once a
# success lies within half of it, the guess goes this close (or half the resolution).
FAR_MARGIN = 0.10
NEAR_MARGIN = 0.01
# A length whose predicted call takes this many times the limit is not run: far over where the
# model extrapolates beyond twice the longest success, a quarter over within it (the bracket's
# upper end next to a success the model is anchored on).
FAR_OVER_TIME = 2.0
NEAR_OVER_TIME = 1.25
# ... and only where the model's longest call took this share of the limit: the time of short
# calls is too noisy to extrapolate a verdict from.
MIN_BASIS_SHARE = 0.1
# A failure the model did not expect: a peak predicted under this share of the budget, or a
# time under this share of the limit.
UNEXPECTED_SHARE = 0.5
UNEXPECTED_TIME_SHARE = 0.5
# After this many model-guided guesses failed, the model does not know this edge (an OOM point
# that moves from run to run, say): bisection alone from there.
MODEL_MISSES = 2
# Without --resolution a search stops within this share of its answer (at least the
# granularity): a process's memory differs by about this much from one to the next (a CPU's
# mapped memory before its trial, say), so a finer bracket would be noise, and each halving of
# it costs a trial near the limit, the longest trials of a search.
DEFAULT_RELATIVE_RESOLUTION = 0.01
# The search stops at this many failed confirmations; each one before retreats twice as far
# below the failure (in resolutions) as the one before it.
CONFIRMATION_FAILURES = 3
# Statuses that say nothing about the limit: a crash or a kill runs once more.
FLAKY = ("killed", "error")
# The phase of a length recorded as predicted, not run.
PREDICTED = "predicted"


@dataclass(frozen=True)
class Prediction:
    """What the model said of a length before it ran (recorded on the trial's row)."""

    peak_bytes: float | None = None  # the peak the memory fit predicts (the fitted counter)
    time_ms: float | None = None  # one warm call
    max_seq: int | None = None  # the largest length the model predicts, memory and time together


@dataclass(frozen=True)
class Outcome:
    """What a probe reports: its status and, for a success, what the model learns from it."""

    status: str
    peak_bytes: float | None = None  # the fitted peak (the allocator's footprint on a GPU)
    time_ms: float | None = None  # one warm call (the time limit is judged on it)
    flops: float | None = None  # FLOPs of one call
    budget: float | None = None  # bytes the fitted peak may reach here, as measured so far
    degree: int | None = None  # the memory law this trial showed, where it differs (a quadratic backend ran)
    floor_bytes: float | None = None  # q, k, v and the output: a peak is never below them


# probe(length, phase, attempt, prediction) -> Outcome; phase PREDICTED records without running
Probe = Callable[[int, str, int, Prediction | None], Outcome]


@dataclass(frozen=True)
class Limits:
    start: int
    granularity: int  # every length is a multiple of it
    max_len: int
    resolution: int = 0  # stop once failure - success <= the resolution (on the granularity's grid)
    degree: int = 1  # of the memory fit: 1 linear, 2 quadratic
    time_limit_ms: float | None = None  # the per-call limit (None: none predicted)
    relative: float = 0.0  # ... or this share of the largest success, where that is more
    budget_s: float | None = None  # no trial starts after this many seconds of the search (None: no budget)

    @property
    def gap(self) -> int:
        """The resolution on the granularity's grid: guesses are multiples of it, and the
        search stops once the bracket is this narrow (or ``gap_at`` its lower end)."""
        return max(self.granularity, self.up_grid(self.resolution))

    def gap_at(self, lo: int) -> int:
        """The bracket's width that ends the search with ``lo`` its largest success."""
        return max(self.gap, self.up_grid(self.relative * lo))

    def up_grid(self, x: float) -> int:
        return -(-int(x) // self.granularity) * self.granularity


@dataclass
class SearchResult:
    best: int  # largest length that ran (0: none did)
    first_failure: int | None  # smallest length that failed (None: none did, up to the cap)
    stop_status: str  # status of first_failure, or "cap"
    tried: list[tuple[int, str]] = field(default_factory=list)  # every trial, retries and confirmation included
    confirmed: bool = False  # the largest success ran again in a fresh process and ran
    predicted_max: int | None = None  # the model's largest length at the end
    failure_predicted: bool = False  # first_failure was predicted (time), not run

    @property
    def stopped_by(self) -> str:
        from attnbench.results import STOPPED_BY

        return STOPPED_BY.get(self.stop_status, self.stop_status)

    @property
    def margin(self) -> int | None:
        """Tokens between the largest success and the smallest failure."""
        return self.first_failure - self.best if self.first_failure is not None and self.best else None


class _Search:
    def __init__(self, probe: Probe, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.probe, self.lim, self.clock = probe, limits, clock
        self.started = clock()
        self.out_of_time = False  # the budget ran out with lengths left to try
        self.lo, self.hi, self.hi_status, self.hi_predicted = 0, None, "cap", False
        self.ceiling: int | None = None  # lengths stay at or under it once a confirmation failed
        self.successes: dict[int, Outcome] = {}
        self.budgets: list[float] = []
        self.attempts: dict[int, int] = {}
        self.tried: list[tuple[int, str]] = []
        self.missed = False  # the last model-guided guess failed: bisect once
        self.misses = 0  # model-guided guesses that failed
        self.step = 0  # the step above a success the model puts at the limit (0: one resolution)
        self.contradicted = False  # a failure has contradicted the model once

    # --- the model ----------------------------------------------------------------------
    def memory_fit(self):
        """The memory fit, or None where there is none that grows (short trials' peaks can be
        all fixed costs: no limit follows from them)."""
        points = sorted((n, o.peak_bytes) for n, o in self.successes.items() if o.peak_bytes)
        declared = max([self.lim.degree, *(o.degree for o in self.successes.values() if o.degree)])
        lengths, peaks = [n for n, _ in points], [p for _, p in points]
        # peaks that curve upward are fitted as a curve
        fit = memory_model(lengths, peaks, declared) or fit_leading(lengths, peaks, declared)
        return fit if fit is not None and fit.coef[-1] > 0 else None

    def floor_per_token(self) -> float | None:
        """Bytes of q, k, v and the output per token (the floor is linear in the length)."""
        return max((o.floor_bytes / n for n, o in self.successes.items() if o.floor_bytes), default=None)

    def time_model(self) -> TimeModel | None:
        return fit_time([(n, o.time_ms, o.flops) for n, o in self.successes.items()])

    def budget(self) -> float | None:
        """The bytes the fitted peak may reach: as measured (the median of the last three), and
        at least the largest fitted peak that ran (a CPU's resident set is not the address
        space its limit caps)."""
        if not self.budgets:
            return None
        ran = max((o.peak_bytes for o in self.successes.values() if o.peak_bytes), default=0.0)
        return max(statistics.median(self.budgets[-3:]), ran)

    def predict(self, n: int | None = None) -> Prediction:
        fit, times, budget = self.memory_fit(), self.time_model(), self.budget()
        memory = fit.max_seq(budget) if fit is not None and budget else None
        if memory is not None and self.floor_per_token():
            # short trials' peaks are mostly fixed costs: a slope fitted to their noise can be
            # below the floor's, and put the limit where the inputs alone would not fit
            memory = min(memory, budget / self.floor_per_token())
        bounds = [memory] if memory is not None else []
        if times is not None and self.lim.time_limit_ms:
            bounds.append(times.max_seq(self.lim.time_limit_ms))
        # where memory is bounded, no limit is predicted before its fit says where (time alone would jump past it)
        unknown = budget is not None and memory is None
        return Prediction(
            peak_bytes=fit(n) if fit is not None and n is not None else None,
            time_ms=times(n) if times is not None and n is not None else None,
            max_seq=int(min(bounds)) if bounds and not unknown else None,
        )

    # --- the lengths --------------------------------------------------------------------
    def on_grid(self, x: float, grid: int) -> int:
        return int(x) // grid * grid

    @property
    def top(self) -> int | None:
        """What the next lengths stay under: the smallest failure, or just above the ceiling
        a failed confirmation set."""
        above = self.ceiling + self.lim.granularity if self.ceiling is not None else None
        return min((x for x in (self.hi, above) if x is not None), default=None)

    def bisect(self) -> tuple[int | None, str]:
        mid = self.lo + self.on_grid((self.top - self.lo) // 2, self.lim.granularity)
        return (mid, "bisect") if mid > self.lo else (None, "")

    def next_length(self) -> tuple[int | None, str]:
        lim = self.lim
        if not self.tried:
            return lim.start, "grow"
        top = self.top
        if top is not None and top - self.lo <= lim.gap_at(self.lo):
            return None, ""
        cap = self.on_grid(lim.max_len, lim.granularity)
        if top is None and self.lo >= cap:
            return None, ""
        if self.lo == 0:  # the first length failed: below it
            return self.bisect()
        target = self.predict().max_seq
        under = self.below_failure(target)
        if under is not None and self.misses < MODEL_MISSES:
            self.missed = False
            return under, "bracket"
        if target is None or self.missed or self.misses >= MODEL_MISSES:
            self.missed = False
            if top is None:
                return min(2 * self.lo, cap), "grow"
            return self.bisect()
        # just below the predicted limit: far below while the model extrapolates from short
        # trials, else by 1% of it or half the resolution, whichever is less
        near = 2 * self.lo >= target
        below = min(NEAR_MARGIN * target, lim.gap_at(self.lo) / 2) if near else FAR_MARGIN * target
        guess = max(self.on_grid(target - below, lim.gap), lim.granularity)
        phase = "predict"
        if guess < self.lo + self.step_above():
            # the model puts the limit within a step of what ran: guesses there would creep up
            # a resolution at a time, so bracket it one step above, then bisect
            guess, phase = self.lo + self.step_above(), "bracket"
        if top is not None and guess >= top:
            return self.bisect()
        return min(guess, cap), phase

    def step_above(self) -> int:
        """The step above the largest success where the model puts the limit: the resolution
        (a near guess stays half of it under the model's limit), doubled after each step that
        ran past where the model still puts the limit, at most doubling the length."""
        return min(max(self.step, self.lim.gap_at(self.lo)), self.lo)

    def below_failure(self, target: int | None) -> int | None:
        """One resolution under the smallest failure, where the model puts the limit at or
        above that failure and the failure is within twice the largest success: the limit is
        just below it, so this brackets it where a bisection would halve (a far jump that
        failed says less)."""
        top = self.top
        if target is None or top is None or target < top or 2 * self.lo < top:
            return None
        under = self.on_grid(top - self.lim.gap_at(self.lo), self.lim.granularity)
        return under if under > self.lo else None

    # --- one length ---------------------------------------------------------------------
    def run(self, n: int, phase: str) -> tuple[Outcome, bool]:
        """The outcome at ``n`` and whether it was predicted rather than run."""
        prediction = self.predict(n)
        if phase != "confirm" and self.over_time(n, prediction):
            return self.attempt(n, PREDICTED, prediction), True
        out = self.attempt(n, phase, prediction)
        if phase != "confirm" and out.status != "ok" and self.unexpected(out, prediction):
            out = self.attempt(n, phase, prediction)
        if out.status == "ok":
            self.successes[n] = out
            if out.budget:
                self.budgets.append(out.budget)
        return out, False

    def over_time(self, n: int, p: Prediction) -> bool:
        """The model puts a call at ``n`` over the limit, from a call long enough to say so."""
        limit, times = self.lim.time_limit_ms, self.time_model()
        if not (limit and p.time_ms and times) or times.time_ms < MIN_BASIS_SHARE * limit:
            return False
        return p.time_ms > (NEAR_OVER_TIME if n <= 2 * self.lo else FAR_OVER_TIME) * limit

    def attempt(self, n: int, phase: str, prediction: Prediction) -> Outcome:
        self.attempts[n] = self.attempts.get(n, 0) + 1
        out = self.probe(n, phase, self.attempts[n], prediction)
        self.tried.append((n, out.status))
        return out

    def unexpected(self, out: Outcome, p: Prediction) -> bool:
        """A failure that says nothing about a limit above the largest success runs once more:
        a crash or a kill, or the first failure where the model saw plenty of room (after that
        the model has been wrong, and its view is no evidence)."""
        if out.status in FLAKY:
            return True
        if self.contradicted:
            return False
        budget, limit = self.budget(), self.lim.time_limit_ms
        room = (
            out.status in ("oom", "host-oom") and p.peak_bytes and budget and p.peak_bytes < UNEXPECTED_SHARE * budget
        ) or (out.status == "time-limit" and p.time_ms and limit and p.time_ms < UNEXPECTED_TIME_SHARE * limit)
        self.contradicted = bool(room)
        return bool(room)

    def learn(self, n: int, phase: str, out: Outcome, predicted: bool) -> None:
        if out.status == "ok":
            # a step that ran where the model, told of it, still puts the limit below it: the
            # model is low, and the next step doubles
            target = self.predict().max_seq if phase == "bracket" else None
            self.step = 2 * (n - self.lo) if target is not None and target < n and n > self.lo else 0
            self.lo = max(self.lo, n)
            return
        if self.hi is None or n < self.hi:
            self.hi, self.hi_status, self.hi_predicted = n, out.status, predicted
        self.missed = phase in ("predict", "bracket")
        self.misses += self.missed
        self.step = 0

    def retreat(self, failures: int) -> None:
        """After ``failures`` failed confirmations, the last at ``self.hi``: lengths stay
        2**failures resolutions below it, where a fresh process is likelier to hold them too,
        and the search goes on from the largest success there."""
        gap = self.lim.gap_at(self.hi)
        self.ceiling = max(self.on_grid(self.hi - 2**failures * gap, self.lim.granularity), 0)
        self.lo = max((m for m in self.successes if m <= self.ceiling), default=0)

    # --- the search ---------------------------------------------------------------------
    def spent(self, n: int | None = None) -> bool:
        """Whether the budget is out, or too short for a trial at ``n``: at least its first
        call and one timed call, each as long as the model predicts, at most the limit."""
        budget, limit = self.lim.budget_s, self.lim.time_limit_ms
        if budget is None:
            return False
        call_ms = (self.predict(n).time_ms or 0.0) if n is not None else 0.0
        trial_s = 2 * min(call_ms, limit or call_ms) / 1e3
        return self.clock() - self.started + trial_s >= budget

    def search(self) -> SearchResult:
        confirmed, confirm_failures = False, 0
        while True:
            n, phase = self.next_length()
            while n is not None and not self.spent(n):
                out, predicted = self.run(n, phase)
                self.learn(n, phase, out, predicted)
                n, phase = self.next_length()
            self.out_of_time = n is not None
            if not self.lo or self.spent(self.lo):  # nothing to confirm, or no time to
                break
            out, _ = self.run(self.lo, "confirm")
            if out.status == "ok":
                confirmed = True
                break
            # the largest success failed in a fresh process: the limit is below it, and the
            # successes just under it are no surer (their peaks still inform the model)
            confirm_failures += 1
            self.hi, self.hi_status, self.hi_predicted = self.lo, out.status, False
            self.successes.pop(self.lo, None)
            if confirm_failures >= CONFIRMATION_FAILURES:
                self.lo = max((m for m in self.successes if m < self.hi), default=0)
                break
            self.retreat(confirm_failures)
        return SearchResult(
            self.lo,
            self.hi,
            BUDGET if self.out_of_time else self.hi_status,
            self.tried,
            confirmed,
            self.predict().max_seq,
            self.hi_predicted,
        )


def predicted_search(probe: Probe, limits: Limits, clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """The largest length that runs, its bracket and whether it was confirmed (see the module).
    No trial starts that the model expects to end after ``limits.budget_s`` seconds of
    ``clock``: the answer is then a lower bound (stop status ``budget``), unconfirmed."""
    if limits.granularity <= 0 or limits.start <= 0 or limits.start % limits.granularity:
        raise ValueError(f"start {limits.start} must be a positive multiple of granularity {limits.granularity}")
    return _Search(probe, limits, clock).search()


def grow_then_bisect(
    probe: Callable[[int, str], str], start: int, granularity: int, max_len: int, resolution: int = 0
) -> SearchResult:
    """The search without a model: double from ``start`` until the first failure, then bisect
    between the last success and the first failure down to ``max(granularity, resolution)``."""
    if granularity <= 0 or start <= 0 or start % granularity:
        raise ValueError(f"start {start} must be a positive multiple of granularity {granularity}")
    stop_gap = max(granularity, resolution)
    tried: list[tuple[int, str]] = []

    def run(n: int, phase: str) -> str:
        status = probe(n, phase)
        tried.append((n, status))
        return status

    lo, hi, hi_status = 0, None, "cap"
    n = start
    while n <= max_len:
        status = run(n, "grow")
        if status != "ok":
            hi, hi_status = n, status
            break
        lo, n = n, n * 2
    if hi is None:
        return SearchResult(lo, None, "cap", tried)
    while hi - lo > stop_gap:
        mid = lo + (hi - lo) // 2 // granularity * granularity
        if mid <= lo:
            break
        status = run(mid, "bisect")
        if status == "ok":
            lo = mid
        else:
            hi, hi_status = mid, status
    return SearchResult(lo, hi, hi_status, tried)
