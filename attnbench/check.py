"""The regression check: compare the result files of a change with those of a baseline.

Trials match by identity: implementation, configuration, shape, dtype, device, mode,
causality, world size and strategy, and the device model they ran on (results of different
device models are never compared). Each matched pair is judged on

- time: a regression only when the current median is slower than ``time_factor`` times the
  baseline's *and* a Mann-Whitney U test on the stored raw samples is significant at
  ``alpha`` (asv's rule); improvements the same way. Samples too few for the test ever to
  reach ``alpha`` make a moved median *inconclusive*, which fails the gate, never a pass;
- memory: peak allocated memory above ``memory_factor`` times the baseline's;
- capacity: a lower max-seq for the same series, or a trial that ran and now fails;
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

from scipy.stats import mannwhitneyu

from attnbench.errors import AttnbenchError
from attnbench.report.markdown import table
from attnbench.report.sweep_tables import TRIAL_KINDS, max_seq_summary
from attnbench.results import SCHEMA_VERSION, clean_floats, read_rows, result_files
from attnbench.units import format_bytes

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
    alpha: float = 0.002
    aspects: tuple[str, ...] = ASPECTS
    deterministic: bool = False
    allow_missing: bool = False  # missing trials or reference checks do not fail the gate

    def check(self) -> None:
        if not self.time_factor >= 1.0 or not self.memory_factor >= 1.0:
            raise AttnbenchError("--time-factor and --memory-factor must be at least 1.0, e.g. --time-factor 1.10")
        if not 0.0 < self.alpha < 1.0:
            raise AttnbenchError(f"--alpha must be between 0 and 1, e.g. 0.002; got {self.alpha}")
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

def smallest_p_value(n1: int, n2: int) -> float:
    """The smallest two-sided Mann-Whitney U p-value that n1 and n2 samples can give: every
    sample of one side below every sample of the other, one ordering out of C(n1+n2, n1),
    counted in both directions."""
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def min_samples_per_side(alpha: float) -> int:
    """Fewest samples per side (equal counts) with which significance at ``alpha`` is possible."""
    n = 1
    while smallest_p_value(n, n) > alpha:
        n += 1
    return n


@dataclass(frozen=True)
class TimeVerdict:
    verdict: str        # regression | improvement | inconclusive | unchanged
    ratio: float        # current median / baseline median
    p_value: float | None
    evidence: str


def compare_times(baseline: list[float], current: list[float], factor: float, alpha: float) -> TimeVerdict:
    """asv's rule: the median moved beyond ``factor`` and the samples differ significantly.

    Two-sided test: the same test decides both "slower" and "faster", so ``alpha`` bounds the
    chance of any false verdict on a trial (one-sided tests for each direction would double it).
    """
    base_med, cur_med = statistics.median(baseline), statistics.median(current)
    ratio = cur_med / base_med if base_med > 0 else math.inf
    n = f"{len(baseline)} vs {len(current)} samples"
    slower, faster = ratio > factor, ratio < 1.0 / factor
    if not (slower or faster):
        return TimeVerdict("unchanged", ratio, None, f"within x{factor:g} ({n})")
    floor = smallest_p_value(len(baseline), len(current))
    if floor > alpha:
        need = min_samples_per_side(alpha)
        return TimeVerdict("inconclusive", ratio, None,
                           f"{n}: Mann-Whitney U cannot reach p <= {alpha:g} (smallest possible p {floor:.2g}); "
                           f"record at least {need} samples per trial (min_samples)")
    p = float(mannwhitneyu(current, baseline, alternative="two-sided").pvalue)
    p = 1.0 if math.isnan(p) else p  # all samples equal
    if p > alpha:
        return TimeVerdict("unchanged", ratio, p, f"not significant: p = {p:.2g} > {alpha:g} ({n})")
    return TimeVerdict("regression" if slower else "improvement", ratio, p, f"p = {p:.2g} ({n})")


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
    if not n:
        return "none"
    for suffix, size in (("M", 2**20), ("K", 2**10)):
        if n >= size and n % (size // 8) == 0:
            v = n / size
            return f"{v:.0f}{suffix}" if v == int(v) else f"{v:g}{suffix}"
    return str(n)


def describe(row: dict[str, Any], with_len: bool = True) -> str:
    label = row.get("label") or row["impl"] + (
        "(" + ", ".join(f"{k}={_list(v)}" for k, v in row.get("config", {}).items()) + ")" if row.get("config") else "")
    bits = [label, row.get("dtype", "?"), f"B={row.get('batch')} H={row.get('heads')} D={row.get('head_dim')}"]
    if row.get("mode"):
        bits.append(row["mode"])
    if row.get("causal"):
        bits.append("causal")
    if row.get("world_size", 1) != 1:
        bits.append(f"{row['world_size']} GPUs {row.get('strategy', '')}".strip())
    if with_len:
        bits.append(f"N={short_tokens(row.get('seq_len'))}")
    return " ".join(bits)


def _list(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


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
    problems = [p.replace(": unreadable line skipped (", ": unreadable line (") for p in problems]
    if problems and not skip_unreadable:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise AttnbenchError(f"{label} {problems[0]}{more}: repair or delete the line, "
                             "or pass --skip-unreadable to compare the rest")
    warnings = [f"{label} {p}: skipped" for p in problems]
    rows = [r for r in rows if r.get("kind") in TRIAL_KINDS + ("verify", "max-seq-result")]
    if not rows:
        raise AttnbenchError(f"{label} {path} holds no result rows (trials or reference checks)")
    for r in rows:
        if r.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise AttnbenchError(f"{label} {r['_file']}: result schema {r.get('schema')} is not {SCHEMA_VERSION}; "
                                 "compare results written by the same attnbench schema")
        missing = [k for k in ("impl", "config", "seq_len", "dtype", "device") if k not in r]
        if missing or (r["kind"] != "max-seq-result" and "status" not in r):
            raise AttnbenchError(f"{label} {r['_file']}: a {r['kind']} row lacks {', '.join(missing) or 'status'}; "
                                 "is it an attnbench results file?")
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
            "min_samples_per_side": min_samples_per_side(self.thresholds.alpha),
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
        self._match(self.base.trials, self.cur.trials, self._trial, lambda rows: describe(rows[0]))
        self._match(self.base.capacity, self.cur.capacity, self._capacity,
                    lambda s: f"max-seq of {describe(s['row'], with_len=False)}")
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
            rows, numbers = describe(rows[0]), {"seq_len": rows[0].get("seq_len"), **numbers}
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
        if self.wants("time") and b["samples"] and c["samples"]:
            v = compare_times(b["samples"], c["samples"], self.t.time_factor, self.t.alpha)
            self._add("time", v.verdict, cur_rows, model, _ms(statistics.median(b["samples"])),
                      _ms(statistics.median(c["samples"])), _times(v.ratio), v.evidence,
                      ratio=v.ratio, p_value=v.p_value, n_baseline=len(b["samples"]), n_current=len(c["samples"]))
        if self.wants("memory"):
            self._memory(b, c, cur_rows, model)
        if self.wants("bytes"):
            self._exact(base_rows[0], cur_rows[0], cur_rows, model)

    def _status(self, b, c, cur_rows, model) -> None:
        if b["status"] == c["status"] or (b["status"] != "ok" and c["status"] != "ok"):
            return
        if self.t.deterministic and "time-limit" in (b["status"], c["status"]):
            self.not_compared.append(f"{describe(cur_rows[0])}: {b['status']} -> {c['status']}; "
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
                  _times(ratio), f"peak ({c['counter']}) {'above' if ratio > 1 else 'below'} x{f:g}"
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
        name = f"max-seq of {describe(c['row'], with_len=False)}"
        if not (b["complete"] and c["complete"]):
            side = "baseline" if not b["complete"] else "current"
            self.not_compared.append(f"{name}: the {side} search did not finish")
            return
        if self.t.deterministic and "time" in (b["stopped_by"], c["stopped_by"]):
            self.not_compared.append(f"{name}: stopped by the time limit, which is not deterministic")
            return
        lo, hi = b["max_seq_len"], c["max_seq_len"]
        verdict = "regression" if hi < lo else "improvement" if hi > lo else "unchanged"
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
    """Several rows of one trial on one side (repeated runs): pool the samples of those that ran."""
    ok = [r for r in rows if r["status"] == "ok"]
    peaks = [r["peak_bytes"] for r in ok if r.get("peak_bytes")]
    first = ok[0] if ok else rows[0]
    return {
        "status": "ok" if ok else rows[0]["status"],
        "message": first.get("message") or "",
        "samples": [float(x) for r in ok for x in r.get("times_ms") or []],
        "peak": statistics.median(peaks) if peaks else None,
        "counter": first.get("peak_counter"),
    }


def _verify_name(r: dict[str, Any]) -> str:
    cfg = " ".join(f"{k}={_list(v)}" for k, v in r["config"].items() if k != "max_chunk_tokens")
    return (f"{r['impl']}{' ' + cfg if cfg else ''} {r['dtype']} B={r['batch']} N={r['seq_len']} H={r['heads']} "
            f"D={r['head_dim']}{' causal' if r.get('causal') else ''} on {r['device']}")


def _impls(side: Side) -> str:
    names = sorted({json.loads(k[0])["impl"] for k in side.trials} | {r["impl"] for r in side.verify})
    return f"{side.rows} rows of {', '.join(names) or 'nothing'} on {', '.join(side.models) or '?'}"


def _ms(x: float) -> str:
    return f"{x:,.3g} ms" if x < 100 else f"{x:,.0f} ms"


def _times(ratio: float) -> str:
    return f"x{ratio:.2f}"


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------

ORDER = ("regression", "inconclusive", "improvement")
MARK = {"regression": "❌ regression", "inconclusive": "⚠️ inconclusive", "improvement": "✅ improvement",
        "unchanged": "unchanged"}


def rules_text(t: Thresholds) -> str:
    bits = []
    if "time" in t.aspects:
        bits.append(f"time: median beyond x{t.time_factor:g} and Mann-Whitney U two-sided p <= {t.alpha:g} on the raw "
                    f"samples (possible from {min_samples_per_side(t.alpha)} samples per side)")
    if "memory" in t.aspects:
        bits.append(f"memory: peak beyond x{t.memory_factor:g}")
    if "capacity" in t.aspects:
        bits.append("capacity: lower max-seq, or a trial that ran and now fails")
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
