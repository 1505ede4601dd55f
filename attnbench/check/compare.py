"""The comparison of two sides: match trials, max-seq searches and reference checks, judge
each matched pair on the aspects asked for, and list what only one side has."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.check.identity import describe_trial, order, short_tokens, verify_name
from attnbench.check.loading import Search, Side, contents, load_side
from attnbench.check.outcome import RSS_NOISE_BYTES, CheckReport, Finding, Thresholds
from attnbench.check.significance import MIN_PROCESSES, NOT_GATED, compare_times, unlike_threads
from attnbench.errors import AttnbenchError
from attnbench.results.schema import Trial, Verify
from attnbench.units import clip_text, format_bytes, format_ms, format_ratio

# Exact counts a trial row carries; q, k, v bytes only where the allocator counts them
# (on the CPU they are resident-set growth, which moves with the page cache and the heap).
EXACT_KEYS = ("floor_bytes", "flops_useful", "flops_executed")
ALLOCATOR_EXACT_KEYS = ("inputs_bytes",)
DEFAULTS = Thresholds()


def run_check(
    baseline: Path | Sequence[Path],
    current: Path | Sequence[Path],
    thresholds: Thresholds = DEFAULTS,
    skip_unreadable: bool = False,
) -> CheckReport:
    """Compare two sets of result files (each side one path or several, their rows
    together); raises AttnbenchError when they cannot be compared."""
    thresholds.check()
    any_cpu = thresholds.deterministic
    base, warn_b = load_side(baseline, "baseline", any_cpu, skip_unreadable)
    cur, warn_c = load_side(current, "current", any_cpu, skip_unreadable)
    comparison = Comparison(base, cur, thresholds)
    comparison.run()
    return CheckReport(
        baseline={"path": base.path, "rows": base.rows, "device_models": base.models},
        current={"path": cur.path, "rows": cur.rows, "device_models": cur.models},
        thresholds=thresholds,
        findings=comparison.findings,
        added=comparison.added,
        missing=comparison.missing,
        not_compared=comparison.not_compared,
        warnings=warn_b + warn_c,
    )


class Comparison:
    def __init__(self, base: Side, cur: Side, t: Thresholds) -> None:
        self.base, self.cur, self.t = base, cur, t
        self.findings: list[Finding] = []
        self.added: list[str] = []
        self.missing: list[str] = []
        self.not_compared: list[str] = []
        self.measured = 0  # trials and max-seq series judged on both sides
        self.checked = 0  # reference checks on both sides

    def wants(self, aspect: str) -> bool:
        return aspect in self.t.aspects

    def run(self) -> None:
        self._match(self.base.trials, self.cur.trials, self._trial, lambda rows: describe_trial(rows[0]), _probe)
        self._match(
            self.base.capacity,
            self.cur.capacity,
            self._capacity,
            lambda s: f"max-seq of {describe_trial(s.row, with_len=False)}",
        )
        self._verify()
        # reference checks in common do not make two unrelated sweeps comparable
        if not self.measured and (self.not_compared or not self.checked or self.base.trials or self.cur.trials):
            self._nothing_in_common()

    def _match(self, base: dict, cur: dict, judge, name, probe=lambda value: None) -> None:
        """Judge keys present on both sides; list the rest as added, missing, or measured on
        another device model (never compared). A length one search probed and the other did not
        (``probe`` names its search) is neither: searches take their own path to the answer,
        and the answers are compared."""
        apart: dict[str, int] = defaultdict(int)
        searches = [{(probe(v), k[1]) for k, v in side.items() if probe(v)} for side in (base, cur)]
        base = {k: v for k, v in base.items() if k in cur or not _counted(apart, (probe(v), k[1]), searches[1])}
        cur = {k: v for k, v in cur.items() if k in base or not _counted(apart, (probe(v), k[1]), searches[0])}
        for search, n in sorted(apart.items()):
            self.not_compared.append(
                f"{search}: {n} length{'s' * (n > 1)} probed on one side only (the searches took "
                "different paths; their answers are compared)"
            )
        for key in sorted(base.keys() & cur.keys(), key=order):
            self.measured += 1
            judge(base[key], cur[key], key[1])
        base_models, cur_models = defaultdict(set), defaultdict(set)
        for ident, model in base:
            base_models[ident].add(model)
        for ident, model in cur:
            cur_models[ident].add(model)
        for key in sorted(base.keys() - cur.keys(), key=order):
            other = cur_models.get(key[0], set()) - base_models[key[0]]
            if other:
                self.not_compared.append(
                    f"{name(base[key])}: baseline on {key[1]}, current on "
                    f"{', '.join(sorted(other))}; different device models are never compared"
                )
            else:
                self.missing.append(f"{name(base[key])} [{key[1]}]")
        for key in sorted(cur.keys() - base.keys(), key=order):
            if not base_models.get(key[0]):
                self.added.append(f"{name(cur[key])} [{key[1]}]")

    def _add(self, aspect, verdict, rows, model, baseline, current, change, evidence="", **numbers) -> None:
        """``rows``: a trial's rows, or the name of what was judged."""
        if isinstance(rows, list):
            rows, numbers = describe_trial(rows[0]), {"seq_len": rows[0].seq_len, **numbers}
        self.findings.append(Finding(aspect, verdict, rows, model, baseline, current, change, evidence, numbers))

    # --- one matched trial --------------------------------------------------------------
    def _trial(self, base_rows: list[Trial], cur_rows: list[Trial], model: str) -> None:
        b, c = Pooled.of(base_rows), Pooled.of(cur_rows)
        if self.wants("capacity"):
            self._status(b, c, cur_rows, model)
        if b.status != "ok" or c.status != "ok":
            if self.wants("bytes"):
                self._exact(base_rows[0], cur_rows[0], cur_rows, model)
            return
        if self.wants("time") and b.processes and c.processes:
            self._time(b, c, cur_rows, model)
        if self.wants("memory"):
            self._memory(b, c, cur_rows, model)
        if self.wants("bytes"):
            self._exact(base_rows[0], cur_rows[0], cur_rows, model)

    def _time(self, b: Pooled, c: Pooled, cur_rows: list[Trial], model: str) -> None:
        device = cur_rows[0].device
        factor = self.t.time_factor_for(device)
        # a CPU's calls by the CPU time they cost where every process of both sides recorded it
        cpu_time = device == "cpu" and b.cpu_time and c.cpu_time
        v = compare_times(
            b.cpu_processes if cpu_time else b.processes,
            c.cpu_processes if cpu_time else c.processes,
            device,
            factor,
            cpu_time,
            unlike_threads(b.threads, c.threads),
        )
        self._add(
            "time",
            v.verdict,
            cur_rows,
            model,
            format_ms(v.baseline_ms, adaptive=True),
            format_ms(v.current_ms, adaptive=True),
            format_ratio(v.ratio),
            v.evidence,
            ratio=v.ratio,
            factor=factor,
            noise=v.noise,
            n_baseline=sum(map(len, b.processes)),
            n_current=sum(map(len, c.processes)),
            processes_baseline=len(b.processes),
            processes_current=len(c.processes),
            clock="cpu-time" if cpu_time else "wall",
        )

    def _status(self, b: Pooled, c: Pooled, cur_rows: list[Trial], model: str) -> None:
        if b.status == c.status or (b.status != "ok" and c.status != "ok"):
            return
        if self.t.deterministic and "time-limit" in (b.status, c.status):
            self.not_compared.append(
                f"{describe_trial(cur_rows[0])}: {b.status} -> {c.status}; a time limit is not deterministic"
            )
            return
        near = _near_the_time_limit(b, c, cur_rows, self.t.time_factor_for(cur_rows[0].device))
        if near:
            self.not_compared.append(f"{describe_trial(cur_rows[0])}: {b.status} -> {c.status}; {near}")
            return
        if c.status != "ok":
            self._add(
                "capacity", "regression", cur_rows, model, "ran", c.status, "now fails", clip_text(c.message, 200)
            )
        else:
            self._add("capacity", "improvement", cur_rows, model, b.status, "ran", "now runs")

    def _memory(self, b: Pooled, c: Pooled, cur_rows: list[Trial], model: str) -> None:
        """A peak beyond the factor and beyond the noise of its counter: the spread between
        processes. On the CPU the tensor bytes a call held are exact run to run; a resident
        set moves between processes, so its growth is judged only where each side measured
        that spread (two processes or more), and never below RSS_NOISE_BYTES."""
        counter, base, cur = memory_counter(b, c)
        if not (base and cur):
            return
        b_peak, c_peak = statistics.median(base), statistics.median(cur)
        ratio = c_peak / b_peak
        f = self.t.memory_factor
        resident = _resident_set(counter)
        noise = max(_spread(base), _spread(cur), RSS_NOISE_BYTES if resident else 0)
        if 1 / f <= ratio <= f:
            verdict, evidence = "unchanged", f"within x{f:g}"
        elif resident and min(len(base), len(cur)) < MIN_PROCESSES:
            verdict = NOT_GATED
            evidence = (
                f"{counter} moves between processes and one process on a side cannot show by how much; "
                f"measure each point in {MIN_PROCESSES} processes or more (--repeat 3)"
            )
        elif abs(c_peak - b_peak) <= noise:
            verdict = NOT_GATED
            evidence = (
                f"a change of {format_bytes(abs(c_peak - b_peak))} is within the noise of {counter} "
                f"({format_bytes(noise)})"
            )
        else:
            verdict = "regression" if ratio > f else "improvement"
            evidence = (
                f"peak ({counter}) {'above' if ratio > 1 else 'below'} x{f:g} and beyond its noise "
                f"({format_bytes(noise)})"
            )
        self._add(
            "memory",
            verdict,
            cur_rows,
            model,
            format_bytes(b_peak),
            format_bytes(c_peak),
            format_ratio(ratio),
            evidence,
            ratio=ratio,
            counter=counter,
        )

    def _exact(self, b: Trial, c: Trial, cur_rows: list[Trial], model: str) -> None:
        keys = EXACT_KEYS + (ALLOCATOR_EXACT_KEYS if str(c.peak_counter or "").startswith("cuda") else ())
        compared = [k for k in keys if getattr(b, k) is not None and getattr(c, k) is not None]
        changed = [k for k in compared if getattr(b, k) != getattr(c, k)]
        if not compared:
            return
        if changed:
            self._add(
                "bytes",
                "regression",
                cur_rows,
                model,
                ", ".join(f"{k} {getattr(b, k):,}" for k in changed),
                ", ".join(f"{k} {getattr(c, k):,}" for k in changed),
                "changed",
                "exact counts differ: if the change is intended, regenerate the baseline",
            )
        else:
            self._add("bytes", "unchanged", cur_rows, model, "equal", "equal", "", ", ".join(compared))

    # --- capacity -----------------------------------------------------------------------
    def _capacity(self, b: Search, c: Search, model: str) -> None:
        if not self.wants("capacity"):
            return
        name = f"max-seq of {describe_trial(c.row, with_len=False)}"
        if not (b.complete and c.complete):  # a lower bound is not an answer: said, never passed silently
            sides = [side for side, s in (("baseline", b), ("current", c)) if not s.complete]
            self._add(
                "capacity",
                NOT_GATED,
                name,
                model,
                f"{short_tokens(b.max_seq_len)}{'' if b.complete else ' (unfinished)'}",
                f"{short_tokens(c.max_seq_len)}{'' if c.complete else ' (unfinished)'}",
                "",
                f"the {' and '.join(sides)} search did not finish: its answer is a lower bound; "
                "finish it (--resume --out DIR) and check again",
            )
            return
        if self.t.deterministic and "time" in (b.stopped_by, c.stopped_by):
            self.not_compared.append(f"{name}: stopped by the time limit, which is not deterministic")
            return
        lo, hi = b.max_seq_len, c.max_seq_len
        verdict = "regression" if hi < lo else "improvement" if hi > lo else "unchanged"
        if "time" in (b.stopped_by, c.stopped_by) and abs(hi - lo) <= _resolution_step(b, c):
            verdict = "unchanged"  # a time limit moves with the clock by one bisection step
        self._add(
            "capacity",
            verdict,
            name,
            model,
            f"{short_tokens(lo)} (stopped by {b.stopped_by})",
            f"{short_tokens(hi)} (stopped by {c.stopped_by})",
            "" if hi == lo else f"{short_tokens(lo)} -> {short_tokens(hi)}",
            f"memory limit {format_bytes(c.row.memory_limit)}" if c.row.memory_limit else "",
            baseline_max_seq=lo,
            current_max_seq=hi,
        )

    # --- correctness ----------------------------------------------------------------------
    def _verify(self) -> None:
        base = {r.identity_key(): r for r in self.base.verify}
        cur: dict[str, list[Verify]] = defaultdict(list)
        for r in self.cur.verify:
            cur[r.identity_key()].append(r)
        self.checked += len(base.keys() & cur.keys())
        for key in sorted(base.keys() - cur.keys()):
            self.missing.append(f"reference check {verify_name(base[key])}")
        if not self.wants("correctness"):
            return
        if not self.cur.verify:  # results that never met the reference cannot pass a correctness gate
            self.missing.append(
                "every reference check: the current results hold none (run with the reference check on)"
            )
        for key, rows in cur.items():
            for r in rows:
                was = base[key].status if key in base else "not checked"
                if r.status == UNSUPPORTED and was in (UNSUPPORTED, "not checked"):
                    # a shape the implementation declines, as it did before: no output to be wrong
                    verdict = "unchanged" if was == UNSUPPORTED else NOT_GATED
                    why = f"unsupported: {clip_text(r.message or 'no output', 200)}"
                    self._add("correctness", verdict, verify_name(r), r.device, was, r.status, "", why)
                elif r.status == "pass":
                    self._add(
                        "correctness",
                        "unchanged",
                        verify_name(r),
                        r.device,
                        was,
                        "pass",
                        "",
                        f"rel. error {r.rel_err or 0:.1e} <= {r.tolerance}",
                    )
                else:
                    why = (
                        f"rel. error {r.rel_err:.2e} > tolerance {r.tolerance}"
                        if r.rel_err is not None
                        else clip_text(r.message or "no output", 200)
                    )
                    self._add(
                        "correctness",
                        "regression",
                        verify_name(r),
                        r.device,
                        was,
                        r.status,
                        "fails the float64 reference",
                        why,
                        rel_err=r.rel_err,
                    )

    def _nothing_in_common(self) -> None:
        if self.not_compared:
            raise AttnbenchError(
                f"baseline was measured on {', '.join(self.base.models) or '?'}, current on "
                f"{', '.join(self.cur.models) or '?'}: different device models are never compared; "
                "compare results of the same device model"
                + (
                    ""
                    if self.t.deterministic
                    else " (or pass --deterministic to gate CPU results on what does not depend on the CPU model)"
                )
            )
        raise AttnbenchError(
            f"baseline {self.base.path} and current {self.cur.path} have no trial or reference check in common "
            f"(baseline: {contents(self.base)}; current: {contents(self.cur)}): compare runs of the same profile"
        )


@dataclass
class Pooled:
    """Several rows of one trial on one side (``--repeat``, repeated runs): the samples and
    peaks of those that ran, one entry per process (each row ran in its own process)."""

    status: str
    message: str
    processes: list[list[float]]
    peaks: list[int]
    counter: str | None
    tensor_peaks: list[int]  # CPU: tensor bytes a call held at once, exact run to run
    cpu_processes: list[list[float]]  # CPU: each process's CPU time per call, where recorded
    threads: set[int]  # CPU: the thread counts its processes recorded

    @classmethod
    def of(cls, rows: list[Trial]) -> Pooled:
        ok = [r for r in rows if r.status == "ok"]
        first = ok[0] if ok else rows[0]
        timed = [r for r in ok if r.times_ms]
        return cls(
            status="ok" if ok else rows[0].status,
            message=first.message or "",
            processes=[[float(x) for x in r.times_ms] for r in timed],
            peaks=[r.peak_bytes for r in ok if r.peak_bytes],
            counter=first.peak_counter,
            tensor_peaks=[r.cpu_tensor_peak_bytes for r in ok if r.cpu_tensor_peak_bytes],
            cpu_processes=[[float(x) for x in r.cpu_times_ms] for r in timed if r.cpu_times_ms],
            threads={r.threads for r in timed if r.threads},
        )

    @property
    def cpu_time(self) -> bool:
        """Every timed process recorded its calls' CPU time."""
        return bool(self.processes) and len(self.cpu_processes) == len(self.processes)


# A reference check's status for a shape the implementation declines (no grouped kernel, say).
UNSUPPORTED = "unsupported"

# The CPU's exact memory count, where both sides recorded it.
TENSOR_PEAK = "cpu.tensor_peak_bytes"


def memory_counter(b: Pooled, c: Pooled) -> tuple[str | None, list[int], list[int]]:
    """The counter two sides' peaks are compared by, and each side's peaks (one per process):
    the exact tensor count where both CPU sides have it, else the rows' own counter where both
    used the same; nothing to compare otherwise."""
    if b.tensor_peaks and c.tensor_peaks:
        return TENSOR_PEAK, b.tensor_peaks, c.tensor_peaks
    if b.counter != c.counter:
        return None, [], []
    return b.counter, b.peaks, c.peaks


def _probe(rows: list[Trial]) -> str | None:
    """The search a trial was a probe of (None for a fixed-length point)."""
    return f"max-seq of {describe_trial(rows[0], with_len=False)}" if rows[0].kind == "max-seq" else None


def _counted(apart: dict[str, int], search: tuple[str | None, str], other_side: set) -> bool:
    """Count a probe of ``search`` (its name and device model) made on one side only where the
    other side ran the same search on the same device model; False for anything else."""
    if search[0] is None or search not in other_side:
        return False
    apart[search[0]] += 1
    return True


def _near_the_time_limit(b: Pooled, c: Pooled, rows: list[Trial], factor: float) -> str:
    """Why a run/time-limit flip is the clock's, not the code's ("" where it is not): the side
    that ran took within the time factor of the limit, so the same code on a busier machine
    crosses it. A flip from far under the limit is a slowdown beyond the factor: a regression."""
    limit_s = rows[0].max_trial_seconds
    ran = b if c.status == "time-limit" else c if b.status == "time-limit" else None
    if ran is None or not limit_s or not ran.processes:
        return ""
    took_ms = statistics.median(min(p) for p in ran.processes)
    if took_ms * factor < limit_s * 1e3:
        return ""
    return f"its calls took {format_ms(took_ms, adaptive=True)}, within x{factor:g} of the {limit_s:g} s limit: the clock's noise"


def _spread(values: list[int]) -> int:
    return max(values) - min(values) if len(values) > 1 else 0


def _resident_set(counter: str | None) -> bool:
    return "rss" in str(counter or "")


def _resolution_step(b: Search, c: Search) -> int:
    """The wider final bracket (first failure minus largest that ran) of two searches."""
    return max((x.first_failure - x.max_seq_len for x in (b, c) if x.first_failure), default=0)
