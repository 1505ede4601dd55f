"""The regression check: compare the result files of a change with those of a baseline.

Trials match by identity: implementation, configuration, shape, dtype, device, mode,
causality, world size and strategy, and the device model they ran on (results of different
device models are never compared). Each matched pair is judged on

- time: a regression only when the current median is slower than ``time_factor`` times the
  baseline's *and* the bootstrap interval of the ratio of medians excludes 1, with the
  processes a trial ran in (``--repeat``) as the resampled unit and Holm's correction across
  all time comparisons at family-wise ``alpha`` (asv's rule on the right unit); improvements
  the same way. Fewer than ``MIN_SAMPLES`` samples make a moved median *inconclusive*, which
  fails the gate, never a pass;
- memory: peak allocated memory above ``memory_factor`` times the baseline's;
- capacity: a lower max-seq for the same series (one stopped by the time limit only beyond
  one bisection step), or a trial that ran and now fails;
- correctness: any reference check (``verify`` row) in the current results that does not pass;
- bytes: exact accounting (floor bytes, FLOPs; q, k, v bytes where the allocator counts them).

``deterministic`` keeps only what does not depend on the clock or on the CPU model
(correctness, capacity under a memory limit, bytes), so a CI runner whose CPU differs from
the baseline's can still gate on them. Reads result files only.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnbench import units
from attnbench.errors import AttnbenchError
from attnbench.measure import stats
from attnbench.report.data import config_text, describe
from attnbench.report.markdown import table
from attnbench.report.sweep_tables import TRIAL_KINDS, max_seq_summary
from attnbench.results import clean_floats, read_rows, result_files
from attnbench.units import format_bytes, format_ms, format_ratio

ASPECTS = ("time", "memory", "capacity", "correctness", "bytes")
DETERMINISTIC_ASPECTS = ("correctness", "capacity", "bytes")
FORMATS = ("text", "markdown", "json")
WORKLOAD_KEYS = ("impl", "config", "batch", "seq_len", "heads", "head_dim", "dtype", "device", "mode", "causal")
VERIFY_KEYS = ("impl", "config", "batch", "seq_len", "heads", "head_dim", "causal", "dtype", "device")
# Exact counts a trial row carries; q, k, v bytes only where the allocator counts them
# (on the CPU they are resident-set growth, which moves with the page cache and the heap).
EXACT_KEYS = ("floor_bytes", "flops_useful", "flops_executed")
ALLOCATOR_EXACT_KEYS = ("inputs_bytes",)
ANY_CPU = "cpu (any model)"


@dataclass(frozen=True)
class Thresholds:
    time_factor: float = 1.10
    memory_factor: float = 1.02
    alpha: float = 0.05      # family-wise, across all time comparisons (Holm)
    aspects: tuple[str, ...] = ASPECTS
    deterministic: bool = False
    allow_missing: bool = False  # missing trials or reference checks do not fail the gate

    def check(self) -> None:
        if not self.time_factor >= 1.0 or not self.memory_factor >= 1.0:
            raise AttnbenchError("--time-factor and --memory-factor must be at least 1.0, e.g. --time-factor 1.10")
        if not 0.0 < self.alpha < 1.0:
            raise AttnbenchError(f"--alpha must be between 0 and 1, e.g. 0.05; got {self.alpha}")
        unknown = [a for a in self.aspects if a not in ASPECTS]
        if unknown or not self.aspects:
            raise AttnbenchError(f"--only {','.join(self.aspects)}: choose from {','.join(ASPECTS)}")
        if self.deterministic and set(self.aspects) - set(DETERMINISTIC_ASPECTS):
            raise AttnbenchError(
                f"--deterministic checks only {','.join(DETERMINISTIC_ASPECTS)}: "
                "time and memory depend on the machine; drop them from --only"
            )


# ---------------------------------------------------------------------------------------
# The time test
# ---------------------------------------------------------------------------------------

# Fewest samples per side for a bootstrap interval of a median to mean anything.
MIN_SAMPLES = 5


@dataclass(frozen=True)
class TimeVerdict:
    verdict: str        # regression | improvement | inconclusive | unchanged
    ratio: float        # current median / baseline median
    p_value: float | None
    evidence: str


def resamples_for(tests: int, alpha: float) -> int:
    """Enough bootstrap resamples that the smallest p-value, 2 / (B + 1), can pass Holm's
    strictest threshold, alpha / tests."""
    return max(stats.RESAMPLES, math.ceil(4 * max(tests, 1) / alpha))


def compare_times(baseline: list[list[float]], current: list[list[float]], factor: float, alpha: float,
                  resamples: int = stats.RESAMPLES) -> TimeVerdict:
    """asv's rule on the right unit: the median moved beyond ``factor`` and the bootstrap
    interval of the ratio of medians excludes 1 (p <= ``alpha`` before Holm's correction,
    which the comparison applies across all trials).

    Each side is a list of processes, each a list of samples. Samples of one process are
    not independent (clocks, allocator and kernel choice are shared), so the bootstrap
    resamples processes first: with several processes (``--repeat``) the process-to-process
    spread is in the test; with one process per side only the factor guards against it.
    """
    b_all = [x for g in baseline for x in g]
    c_all = [x for g in current for x in g]
    ratio = statistics.median(c_all) / statistics.median(b_all) if statistics.median(b_all) > 0 else math.inf
    n = f"{len(b_all)} vs {len(c_all)} samples in {len(baseline)} vs {len(current)} processes"
    slower, faster = ratio > factor, ratio < 1.0 / factor
    if not (slower or faster):
        return TimeVerdict("unchanged", ratio, None, f"within x{factor:g} ({n})")
    if min(len(b_all), len(c_all)) < MIN_SAMPLES:
        return TimeVerdict("inconclusive", ratio, None,
                           f"{n}: too few for an interval; record at least {MIN_SAMPLES} samples per trial (min_samples)")
    p = stats.ratio_p_value(current, baseline, resamples)
    iv = stats.ratio_interval(current, baseline, resamples)
    where = f"ratio 95% interval [{iv.low:.3f}, {iv.high:.3f}], p = {p:.2g}, {n}"
    if p > alpha:
        return TimeVerdict("unchanged", ratio, p, f"not significant: {where}")
    return TimeVerdict("regression" if slower else "improvement", ratio, p, where)


# ---------------------------------------------------------------------------------------
# Reading one side
# ---------------------------------------------------------------------------------------

def device_model(row: dict[str, Any], any_cpu: bool = False) -> str:
    """What a trial ran on: the GPU model for CUDA trials, the CPU model otherwise."""
    env = row.get("env") or {}
    if row.get("device") == "cuda":
        names = sorted({g.get("name", "?") for g in env.get("gpus") or []})
        return " + ".join(names) or env.get("machine") or "unknown GPU"
    return ANY_CPU if any_cpu else f"cpu: {env.get('cpu') or 'unknown'}"


def _canon(row: dict[str, Any], keys: tuple[str, ...]) -> str:
    return json.dumps({k: row.get(k) for k in keys}, sort_keys=True, default=str)


def trial_identity(row: dict[str, Any]) -> str:
    return _canon({**row, "world_size": row.get("world_size", 1), "strategy": row.get("strategy", "single")},
                  WORKLOAD_KEYS + ("world_size", "strategy"))


def capacity_identity(row: dict[str, Any]) -> str:
    """A max-seq series: the workload but its length, and the limits that define capacity."""
    ident = {**row, "seq_len": None, "world_size": row.get("world_size", 1), "strategy": row.get("strategy", "single")}
    return _canon(ident, WORKLOAD_KEYS + ("world_size", "strategy", "memory_limit", "max_trial_seconds"))


def short_tokens(n: int | None) -> str:
    """A length as the check shows it: exact ('2.875M'), 'none' when nothing ran."""
    return units.short_tokens(n, exact=True) if n else "none"


def describe_trial(row: dict[str, Any], with_len: bool = True) -> str:
    """A trial in a finding: the series' name as the report gives it, and its settings."""
    bits = [describe(row), row.get("dtype", "?"), f"B={row.get('batch')} H={row.get('heads')} D={row.get('head_dim')}"]
    if row.get("mode"):
        bits.append(row["mode"])
    if row.get("causal"):
        bits.append("causal")
    if row.get("world_size", 1) != 1:
        bits.append(f"{row['world_size']} GPUs {row.get('strategy', '')}".strip())
    if with_len:
        bits.append(f"N={short_tokens(row.get('seq_len'))}")
    return " ".join(bits)


@dataclass
class Side:
    """One side's rows, keyed for matching."""

    label: str
    path: str
    rows: int
    models: list[str]
    trials: dict[tuple[str, str], list[dict[str, Any]]]
    verify: list[dict[str, Any]]
    capacity: dict[tuple[str, str], dict[str, Any]]


def load_side(path: Path, label: str, any_cpu: bool = False, skip_unreadable: bool = False) -> tuple[Side, list[str]]:
    """Read a results directory or trials.jsonl; anything unusable is one AttnbenchError."""
    path = Path(path)
    files = result_files(path)
    if not files:
        raise AttnbenchError(f"{label} {path} holds no trials.jsonl: give a results directory or a trials.jsonl file")
    rows, problems = read_rows(files)
    # read_rows skips what is not JSON or not a valid row (a field's type, a missing key)
    problems = [p.replace(" line skipped (", " line (").replace(" row skipped (", " row (") for p in problems]
    if problems and not skip_unreadable:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise AttnbenchError(f"{label} {problems[0]}{more}: repair or delete the line, "
                             "or pass --skip-unreadable to compare the rest")
    warnings = [f"{label} {p}: skipped" for p in problems]
    rows = [r for r in rows if r.get("kind") in TRIAL_KINDS + ("verify", "max-seq-result")]
    if not rows:
        raise AttnbenchError(f"{label} {path} holds no result rows (trials or reference checks)")
    trials: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["kind"] in TRIAL_KINDS:
            trials[(trial_identity(r), device_model(r, any_cpu))].append(r)
    side = Side(label, str(path), len(rows), sorted({device_model(r, any_cpu) for r in rows if r["kind"] != "verify"}),
                dict(trials), [r for r in rows if r["kind"] == "verify"], capacities(rows, any_cpu))
    return side, warnings


def capacities(rows: list[dict[str, Any]], any_cpu: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    """Per max-seq series and device model: the largest length that ran (from the trials,
    as the sweep tables derive it) and whether the search finished."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "max-seq" and "series" in r:
            groups[(capacity_identity(r), device_model(r, any_cpu))].append(r)
    finished = [r for r in rows if r["kind"] == "max-seq-result"]
    out = {}
    for (ident, model), group in groups.items():
        series = {r["series"] for r in group}
        done = [r for r in finished if r.get("series") in series and device_model(r, any_cpu) == model]
        # one summary per group, whatever series keys its rows were written with
        summary = max_seq_summary([{**r, "series": ident} for r in group + done])[0]
        out[(ident, model)] = {**summary, "row": group[0]}
    return out


# ---------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------

@dataclass
class Finding:
    aspect: str
    verdict: str         # regression | improvement | inconclusive | unchanged
    trial: str
    device_model: str
    baseline: str
    current: str
    change: str
    evidence: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def blocking(self) -> bool:
        """A regression, or a slowdown the samples cannot confirm or clear."""
        return self.verdict == "regression" or (self.verdict == "inconclusive" and self.numbers.get("ratio", 0) > 1)


@dataclass
class CheckReport:
    baseline: dict[str, Any]
    current: dict[str, Any]
    thresholds: Thresholds
    findings: list[Finding]
    added: list[str]
    missing: list[str]
    not_compared: list[str]
    warnings: list[str]

    def of(self, verdict: str) -> list[Finding]:
        return [f for f in self.findings if f.verdict == verdict]

    @property
    def exit_code(self) -> int:
        """1 on a regression, an unconfirmed slowdown, or (unless allowed) anything the
        baseline measured or checked that the current results lack."""
        return 1 if any(f.blocking for f in self.findings) or self.missing_blocks else 0

    @property
    def missing_blocks(self) -> bool:
        return bool(self.missing) and not self.thresholds.allow_missing

    def headline(self) -> str:
        regressions = self.of("regression")
        inconclusive = [f for f in self.of("inconclusive") if f.blocking]
        bits = []
        if regressions:
            bits.append(f"{len(regressions)} regression{'s' * (len(regressions) != 1)}")
        if inconclusive:
            bits.append(f"{len(inconclusive)} inconclusive slowdown{'s' * (len(inconclusive) != 1)}")
        if self.missing_blocks:
            bits.append(f"{len(self.missing)} missing (pass --allow-missing to accept)")
        verdict = "FAIL" if self.exit_code else "PASS"
        n = len(self.of("improvement"))
        rest = [f"{n} improvement{'s' * (n != 1)}", f"{len(self.of('unchanged'))} unchanged"]
        return f"{verdict}: " + ", ".join(bits + rest)

    def to_json(self) -> dict[str, Any]:
        return clean_floats({
            "result": "fail" if self.exit_code else "pass", "exit_code": self.exit_code,
            "baseline": self.baseline, "current": self.current, "thresholds": asdict(self.thresholds),
            "min_samples_per_side": MIN_SAMPLES,
            "counts": {v: len(self.of(v)) for v in ("regression", "improvement", "inconclusive", "unchanged")},
            "findings": [{**asdict(f), "blocking": f.blocking} for f in self.findings],
            "added": self.added, "missing": self.missing, "not_compared": self.not_compared,
            "warnings": self.warnings,
        })


def run_check(baseline: Path, current: Path, thresholds: Thresholds = Thresholds(),
              skip_unreadable: bool = False) -> CheckReport:
    """Compare two sets of result files; raises AttnbenchError when they cannot be compared."""
    thresholds.check()
    any_cpu = thresholds.deterministic
    base, warn_b = load_side(baseline, "baseline", any_cpu, skip_unreadable)
    cur, warn_c = load_side(current, "current", any_cpu, skip_unreadable)
    comparison = _Comparison(base, cur, thresholds)
    comparison.run()
    return CheckReport(
        baseline={"path": base.path, "rows": base.rows, "device_models": base.models},
        current={"path": cur.path, "rows": cur.rows, "device_models": cur.models},
        thresholds=thresholds, findings=comparison.findings, added=comparison.added,
        missing=comparison.missing, not_compared=comparison.not_compared, warnings=warn_b + warn_c,
    )


class _Comparison:
    def __init__(self, base: Side, cur: Side, t: Thresholds) -> None:
        self.base, self.cur, self.t = base, cur, t
        self.findings: list[Finding] = []
        self.added: list[str] = []
        self.missing: list[str] = []
        self.not_compared: list[str] = []
        self.measured = 0   # trials and max-seq series judged on both sides
        self.checked = 0    # reference checks on both sides

    def wants(self, aspect: str) -> bool:
        return aspect in self.t.aspects

    def run(self) -> None:
        tests = len(self.base.trials.keys() & self.cur.trials.keys())
        self.resamples = stats.RESAMPLES if not self.wants("time") else resamples_for(tests, self.t.alpha)
        self._match(self.base.trials, self.cur.trials, self._trial, lambda rows: describe_trial(rows[0]))
        self._holm()
        self._match(self.base.capacity, self.cur.capacity, self._capacity,
                    lambda s: f"max-seq of {describe_trial(s['row'], with_len=False)}")
        self._verify()
        # reference checks in common do not make two unrelated sweeps comparable
        if not self.measured and (self.not_compared or not self.checked or self.base.trials or self.cur.trials):
            self._nothing_in_common()

    def _match(self, base: dict, cur: dict, judge, name) -> None:
        """Judge keys present on both sides; list the rest as added, missing, or measured on
        another device model (never compared)."""
        for key in sorted(base.keys() & cur.keys(), key=_order):
            self.measured += 1
            judge(base[key], cur[key], key[1])
        base_models, cur_models = defaultdict(set), defaultdict(set)
        for ident, model in base:
            base_models[ident].add(model)
        for ident, model in cur:
            cur_models[ident].add(model)
        for key in sorted(base.keys() - cur.keys(), key=_order):
            other = cur_models.get(key[0], set()) - base_models[key[0]]
            if other:
                self.not_compared.append(f"{name(base[key])}: baseline on {key[1]}, current on "
                                         f"{', '.join(sorted(other))}; different device models are never compared")
            else:
                self.missing.append(f"{name(base[key])} [{key[1]}]")
        for key in sorted(cur.keys() - base.keys(), key=_order):
            if not base_models.get(key[0]):
                self.added.append(f"{name(cur[key])} [{key[1]}]")

    def _add(self, aspect, verdict, rows, model, baseline, current, change, evidence="", **numbers) -> None:
        """``rows``: a trial's rows, or the name of what was judged."""
        if isinstance(rows, list):
            rows, numbers = describe_trial(rows[0]), {"seq_len": rows[0].get("seq_len"), **numbers}
        self.findings.append(Finding(aspect, verdict, rows, model, baseline, current, change, evidence, numbers))

    # --- one matched trial --------------------------------------------------------------
    def _trial(self, base_rows: list[dict], cur_rows: list[dict], model: str) -> None:
        b, c = _pooled(base_rows), _pooled(cur_rows)
        if self.wants("capacity"):
            self._status(b, c, cur_rows, model)
        if b["status"] != "ok" or c["status"] != "ok":
            if self.wants("bytes"):
                self._exact(base_rows[0], cur_rows[0], cur_rows, model)
            return
        if self.wants("time") and b["processes"] and c["processes"]:
            v = compare_times(b["processes"], c["processes"], self.t.time_factor, self.t.alpha, self.resamples)
            b_all = [x for g in b["processes"] for x in g]
            c_all = [x for g in c["processes"] for x in g]
            self._add("time", v.verdict, cur_rows, model, format_ms(statistics.median(b_all), adaptive=True),
                      format_ms(statistics.median(c_all), adaptive=True), format_ratio(v.ratio), v.evidence,
                      ratio=v.ratio, p_value=v.p_value, n_baseline=len(b_all), n_current=len(c_all),
                      processes_baseline=len(b["processes"]), processes_current=len(c["processes"]))
        if self.wants("memory"):
            self._memory(b, c, cur_rows, model)
        if self.wants("bytes"):
            self._exact(base_rows[0], cur_rows[0], cur_rows, model)

    def _holm(self) -> None:
        """Holm's correction across every time comparison: a moved median stays a verdict only
        if its p-value survives; comparisons within the factor count as p = 1."""
        timed = [f for f in self.findings if f.aspect == "time" and f.verdict != "inconclusive"]
        kept = stats.holm([f.numbers.get("p_value") or 1.0 for f in timed], self.t.alpha)
        for f, significant in zip(timed, kept):
            if f.verdict in ("regression", "improvement") and not significant:
                f.verdict = "unchanged"
                f.evidence = f"not significant after Holm's correction over {len(timed)} comparisons: {f.evidence}"

    def _status(self, b, c, cur_rows, model) -> None:
        if b["status"] == c["status"] or (b["status"] != "ok" and c["status"] != "ok"):
            return
        if self.t.deterministic and "time-limit" in (b["status"], c["status"]):
            self.not_compared.append(f"{describe_trial(cur_rows[0])}: {b['status']} -> {c['status']}; "
                                     "a time limit is not deterministic")
            return
        if c["status"] != "ok":
            self._add("capacity", "regression", cur_rows, model, "ran", c["status"], "now fails", c["message"][:200])
        else:
            self._add("capacity", "improvement", cur_rows, model, b["status"], "ran", "now runs")

    def _memory(self, b, c, cur_rows, model) -> None:
        if not (b["peak"] and c["peak"]) or b["counter"] != c["counter"]:
            return
        ratio = c["peak"] / b["peak"]
        f = self.t.memory_factor
        verdict = "regression" if ratio > f else "improvement" if ratio < 1 / f else "unchanged"
        self._add("memory", verdict, cur_rows, model, format_bytes(b["peak"]), format_bytes(c["peak"]),
                  format_ratio(ratio), f"peak ({c['counter']}) {'above' if ratio > 1 else 'below'} x{f:g}"
                  if verdict != "unchanged" else f"within x{f:g}", ratio=ratio)

    def _exact(self, b: dict, c: dict, cur_rows, model) -> None:
        keys = EXACT_KEYS + (ALLOCATOR_EXACT_KEYS if str(c.get("peak_counter", "")).startswith("cuda") else ())
        changed = [k for k in keys if b.get(k) is not None and c.get(k) is not None and b[k] != c[k]]
        compared = [k for k in keys if b.get(k) is not None and c.get(k) is not None]
        if not compared:
            return
        if changed:
            self._add("bytes", "regression", cur_rows, model, ", ".join(f"{k} {b[k]:,}" for k in changed),
                      ", ".join(f"{k} {c[k]:,}" for k in changed), "changed",
                      "exact counts differ: if the change is intended, regenerate the baseline")
        else:
            self._add("bytes", "unchanged", cur_rows, model, "equal", "equal", "", ", ".join(compared))

    # --- capacity -----------------------------------------------------------------------
    def _capacity(self, b: dict, c: dict, model: str) -> None:
        if not self.wants("capacity"):
            return
        name = f"max-seq of {describe_trial(c['row'], with_len=False)}"
        if not (b["complete"] and c["complete"]):
            side = "baseline" if not b["complete"] else "current"
            self.not_compared.append(f"{name}: the {side} search did not finish")
            return
        if self.t.deterministic and "time" in (b["stopped_by"], c["stopped_by"]):
            self.not_compared.append(f"{name}: stopped by the time limit, which is not deterministic")
            return
        lo, hi = b["max_seq_len"], c["max_seq_len"]
        verdict = "regression" if hi < lo else "improvement" if hi > lo else "unchanged"
        if "time" in (b["stopped_by"], c["stopped_by"]) and abs(hi - lo) <= _resolution_step(b, c):
            verdict = "unchanged"  # a time limit moves with the clock by one bisection step
        self._add("capacity", verdict, name, model, f"{short_tokens(lo)} (stopped by {b['stopped_by']})",
                  f"{short_tokens(hi)} (stopped by {c['stopped_by']})",
                  "" if hi == lo else f"{short_tokens(lo)} -> {short_tokens(hi)}",
                  f"memory limit {format_bytes(c['row'].get('memory_limit'))}" if c["row"].get("memory_limit") else "",
                  baseline_max_seq=lo, current_max_seq=hi)

    # --- correctness ----------------------------------------------------------------------
    def _verify(self) -> None:
        base = {_canon(r, VERIFY_KEYS): r for r in self.base.verify}
        cur: dict[str, list[dict]] = defaultdict(list)
        for r in self.cur.verify:
            cur[_canon(r, VERIFY_KEYS)].append(r)
        self.checked += len(base.keys() & cur.keys())
        for key in sorted(base.keys() - cur.keys()):
            self.missing.append(f"reference check {_verify_name(base[key])}")
        if not self.wants("correctness"):
            return
        if not self.cur.verify:  # results that never met the reference cannot pass a correctness gate
            self.missing.append("every reference check: the current results hold none (run with the reference check on)")
        for key, rows in cur.items():
            for r in rows:
                was = base[key]["status"] if key in base else "not checked"
                if r["status"] == "pass":
                    self._add("correctness", "unchanged", _verify_name(r), r["device"], was, "pass", "",
                              f"rel. error {r.get('rel_err') or 0:.1e} <= {r.get('tolerance')}")
                else:
                    why = (f"rel. error {r['rel_err']:.2e} > tolerance {r.get('tolerance')}" if r.get("rel_err") is not None
                           else (r.get("message") or "no output")[:200])
                    self._add("correctness", "regression", _verify_name(r), r["device"], was, r["status"],
                              "fails the float64 reference", why, rel_err=r.get("rel_err"))

    def _nothing_in_common(self) -> None:
        if self.not_compared:
            raise AttnbenchError(
                f"baseline was measured on {', '.join(self.base.models) or '?'}, current on "
                f"{', '.join(self.cur.models) or '?'}: different device models are never compared; "
                "compare results of the same device model"
                + ("" if self.t.deterministic else " (or pass --deterministic to gate CPU results on what does not depend on the CPU model)")
            )
        raise AttnbenchError(
            f"baseline {self.base.path} and current {self.cur.path} have no trial or reference check in common "
            f"(baseline: {_impls(self.base)}; current: {_impls(self.cur)}): compare runs of the same profile"
        )


def _order(key: tuple[str, str]) -> tuple:
    """Series by series, each by length."""
    ident = json.loads(key[0])
    n = ident.pop("seq_len", None) or 0
    return json.dumps(ident, sort_keys=True), key[1], n


def _pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Several rows of one trial on one side (``--repeat``, repeated runs): the samples of
    those that ran, grouped by process."""
    ok = [r for r in rows if r["status"] == "ok"]
    peaks = [r["peak_bytes"] for r in ok if r.get("peak_bytes")]
    first = ok[0] if ok else rows[0]
    return {
        "status": "ok" if ok else rows[0]["status"],
        "message": first.get("message") or "",
        # one group of samples per process (each row ran in its own process)
        "processes": [[float(x) for x in r["times_ms"]] for r in ok if r.get("times_ms")],
        "peak": statistics.median(peaks) if peaks else None,
        "counter": first.get("peak_counter"),
    }


def _resolution_step(b: dict[str, Any], c: dict[str, Any]) -> int:
    """The wider final bracket (first failure minus largest that ran) of two searches."""
    return max((x["first_failure"] - x["max_seq_len"] for x in (b, c) if x.get("first_failure")), default=0)


def _verify_name(r: dict[str, Any]) -> str:
    cfg = config_text(r["config"], sep=" ")
    return (f"{r['impl']}{' ' + cfg if cfg else ''} {r['dtype']} B={r['batch']} N={r['seq_len']} H={r['heads']} "
            f"D={r['head_dim']}{' causal' if r.get('causal') else ''} on {r['device']}")


def _impls(side: Side) -> str:
    names = sorted({json.loads(k[0])["impl"] for k in side.trials} | {r["impl"] for r in side.verify})
    return f"{side.rows} rows of {', '.join(names) or 'nothing'} on {', '.join(side.models) or '?'}"


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------

ORDER = ("regression", "inconclusive", "improvement")
MARK = {"regression": "❌ regression", "inconclusive": "⚠️ inconclusive", "improvement": "✅ improvement",
        "unchanged": "unchanged"}


def rules_text(t: Thresholds) -> str:
    bits = []
    if "time" in t.aspects:
        bits.append(f"time: median beyond x{t.time_factor:g} and the bootstrap interval of the ratio excludes 1, "
                    f"processes resampled as units, Holm-corrected p <= {t.alpha:g} across the comparisons "
                    f"(at least {MIN_SAMPLES} samples per side)")
    if "memory" in t.aspects:
        bits.append(f"memory: peak beyond x{t.memory_factor:g}")
    if "capacity" in t.aspects:
        bits.append("capacity: lower max-seq (a time-limited one beyond one bisection step), or a trial that ran and now fails")
    if "correctness" in t.aspects:
        bits.append("correctness: every reference check passes")
    if "bytes" in t.aspects:
        bits.append("bytes: floor and FLOP counts equal")
    if t.deterministic:
        bits.append("deterministic outputs only: CPU results compare across CPU models")
    return "; ".join(bits)


def render_text(report: CheckReport) -> str:
    lines = [f"attnbench check: {report.headline()}"]
    for side in (report.baseline, report.current):
        name = "baseline" if side is report.baseline else "current"
        lines.append(f"  {name:8}  {side['path']}  ({side['rows']} rows; {', '.join(side['device_models']) or 'reference checks only'})")
    lines.append(f"  rules     {rules_text(report.thresholds)}")
    shown = [f for v in ORDER for f in report.of(v)]
    if shown:
        lines.append("")
    for f in shown:
        lines.append(f"{f.verdict.upper():12} {f.aspect:11} {f.trial} [{f.device_model}]: {f.baseline} -> {f.current}"
                     f"{'  ' + f.change if f.change else ''}{'  (' + f.evidence + ')' if f.evidence else ''}")
    counts = defaultdict(int)
    for f in report.of("unchanged"):
        counts[f.aspect] += 1
    if counts:
        lines.append("unchanged: " + ", ".join(f"{n} {a}" for a, n in counts.items()))
    for title, items in (("added (current only)", report.added), ("missing (baseline only)", report.missing),
                         ("not compared", report.not_compared)):
        if items:
            lines.append(f"{title}: {len(items)}")
            lines += [f"  {x}" for x in items[:20]] + ([f"  ... and {len(items) - 20} more"] if len(items) > 20 else [])
    return "\n".join(lines) + "\n"


def render_markdown(report: CheckReport) -> str:
    icon = "❌" if report.exit_code else "✅"
    parts = [f"### {icon} attnbench check: {report.headline()}\n\n",
             f"Baseline `{report.baseline['path']}` ({', '.join(report.baseline['device_models']) or 'reference checks'}), "
             f"current `{report.current['path']}` ({', '.join(report.current['device_models']) or 'reference checks'}).  \n"
             f"Rules: {rules_text(report.thresholds)}.\n\n"]
    head = ["Verdict", "Aspect", "Trial", "Device", "Baseline", "Current", "Change", "Evidence"]

    def rows(findings):
        return [[MARK[f.verdict], f.aspect, f.trial, f.device_model, f.baseline, f.current, f.change, f.evidence]
                for f in findings]

    shown = [f for v in ORDER for f in report.of(v)]
    if shown:
        parts.append(table(head, rows(shown)))
    else:
        parts.append("No regression, improvement or inconclusive result.\n")
    unchanged = report.of("unchanged")
    if unchanged:
        parts.append(f"\n<details><summary>{len(unchanged)} unchanged</summary>\n\n{table(head, rows(unchanged))}\n</details>\n")
    for title, items in (("added (current only)", report.added), ("missing (baseline only)", report.missing),
                         ("not compared", report.not_compared)):
        if items:
            body = "\n".join(f"- {x}" for x in items)
            parts.append(f"\n<details><summary>{len(items)} {title}</summary>\n\n{body}\n\n</details>\n")
    return "".join(parts)


def render(report: CheckReport, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_json(), indent=2) + "\n"
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    raise AttnbenchError(f"--format {fmt!r}: choose text, markdown or json")
