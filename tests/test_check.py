"""`attnbench check` against result files written by real attnbench runs on the CPU.

Four real runs of one small profile: `base`, a `rerun` of the same code, `hungry` (naive
attention that also holds a second N x N buffer, patched into every process of that run
through a sitecustomize module) and `wrong` (naive attention that applies its 1/sqrt(D)
scale twice). Where a change cannot be produced by a real run, a real file is transformed
and the transformation is written next to it: samples multiplied by 1.3, peaks by 1.05, a
rerun's samples drawn as a random half of the real samples, the CPU model renamed.
"""

import json
import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench import cli
from attnbench.check import Thresholds, compare_times, run_check
from attnbench.measure.timing import summarize
from attnbench.results import read_rows

from conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # every test reads real `attnbench run`s made by a module fixture

# Timed calls of 0.06-0.2 ms: short enough that another process rarely preempts one, so the
# samples stay tight on a loaded machine (longer calls there spread over 10x and more).
# Scores and probabilities of naive attention: 2 * H * N^2 * 4 B = 16 N^2 bytes at H = 2.
# Under 128 MiB naive runs 2.5K (100 MiB) and fails 3K (144 MiB); holding a third N x N
# buffer (24 N^2 bytes) it runs 2K (96 MiB) and fails 2.5K (150 MiB): one bisection step less.
PROFILE = """
device = "cpu"
dtype = "fp32"
batch = 1
heads = 2
head_dim = 16
max_trial_seconds = 60

[[sweep]]
impl = "naive"
kind = "points"
seq_lens = [128, 256]
isolate = false
warmup = 20
min_samples = 200
max_samples = 200
target_ms = 0

[[sweep]]
impl = "sdpa"
kind = "points"
seq_lens = [256]
isolate = false
warmup = 20
min_samples = 200
max_samples = 200
target_ms = 0

[[sweep]]
impl = "naive"
memory_limit = "128MiB"
start = "2K"
resolution = 512
warmup = 0
min_samples = 1
max_samples = 1
target_ms = 0
"""
STEP = 512

PATCHES = {
    "hungry": """
import torch
import attnbench.impls.dense as dense
_forward = dense.NaiveAttention.forward
def forward(self, q, k, v, is_causal=False):
    b, n, h, _ = q.shape
    extra = torch.ones(b, h, n, n, dtype=q.dtype)  # a third N x N buffer, alive through the pass
    out = _forward(self, q, k, v, is_causal)
    del extra
    return out
dense.NaiveAttention.forward = forward
""",
    "wrong": """
import attnbench.impls.dense as dense
_forward = dense.NaiveAttention.forward
def forward(self, q, k, v, is_causal=False):
    return _forward(self, q / q.shape[-1] ** 0.5, k, v, is_causal)  # the scale applied twice
dense.NaiveAttention.forward = forward
""",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real `attnbench run`s of PROFILE, side by side: base, hungry and wrong."""
    root = tmp_path_factory.mktemp("check")
    profile = root / "check.toml"
    profile.write_text(PROFILE)

    def start(name):
        path = str(ROOT)
        if name in PATCHES:
            site = root / f"site-{name}"
            site.mkdir()
            (site / "sitecustomize.py").write_text(PATCHES[name])  # imported by every process of the run
            path = f"{site}{os.pathsep}{ROOT}"
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        return subprocess.Popen(
            [sys.executable, "-m", "attnbench", "run", "--profile", str(profile), "--out", str(root / name)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    procs = {name: start(name) for name in ("base", "hungry", "wrong")}
    outs = {name: p.communicate(timeout=900) for name, p in procs.items()}
    for name in ("base", "hungry"):
        assert procs[name].returncode == 0, outs[name]
    assert procs["wrong"].returncode == 1, outs["wrong"]  # the reference check failed; naive was not swept
    return {name: root / name for name in procs}


def rows_of(path):
    rows, problems = read_rows(path)
    assert problems == []
    return rows


def write_rows(path: Path, rows) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "trials.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({k: v for k, v in r.items() if k != "_file"}) + "\n")
    return path


def attnbench(capsys, *args):
    """`attnbench ARGS` through the console entry point, in this process (no torch import per call)."""
    handler = signal.getsignal(signal.SIGTERM)
    argv = sys.argv
    sys.argv = ["attnbench", *map(str, args)]
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = argv
        signal.signal(signal.SIGTERM, handler)
    out, err = capsys.readouterr()
    return code, out, err


def check_json(capsys, *args):
    code, out, err = attnbench(capsys, "check", *args, "--format", "json")
    assert code in (0, 1), err
    return code, json.loads(out)


def findings(report, aspect=None, verdict=None):
    return [
        f
        for f in report["findings"]
        if (aspect is None or f["aspect"] == aspect) and (verdict is None or f["verdict"] == verdict)
    ]


# ---------------------------------------------------------------------------------------
# The statistics, against their definitions
# ---------------------------------------------------------------------------------------


def synthetic_side(rng, template, processes, shift=1.0, samples=20):
    """Rows of one trial run in ``processes`` fresh processes, with noise as GPUs show it:
    each process its own level (clocks, kernel choice: 2% spread), each call its own jitter
    (1%), and one call in twenty preempted (+25%)."""
    rows = []
    for index in range(processes):
        level = shift * rng.lognormvariate(0.0, 0.02)
        times = [
            template["time_ms"] * level * rng.lognormvariate(0.0, 0.01) * (1.25 if rng.random() < 0.05 else 1.0)
            for _ in range(samples)
        ]
        rows.append({**template, "process": index, "times_ms": times, **summarize(times)})
    return rows


def gate_failures(runs, tmp_path, shift, seeds, processes=3):
    """How many of ``seeds`` synthetic baseline/current pairs fail the time gate."""
    templates = [r for r in rows_of(runs["base"]) if r["kind"] == "points"]
    failed = 0
    for seed in range(seeds):
        rng = random.Random(seed)
        base = [x for t in templates for x in synthetic_side(rng, t, processes)]
        cur = [x for t in templates for x in synthetic_side(rng, t, processes, shift)]
        report = run_check(
            write_rows(tmp_path / "b", base), write_rows(tmp_path / "c", cur), Thresholds(aspects=("time",))
        )
        assert len(report.findings) == len(templates)
        failed += report.exit_code
    return failed


def test_the_gate_passes_identical_distributions_in_100_of_100_seeds(runs, tmp_path):
    assert gate_failures(runs, tmp_path, 1.0, 100) == 0


def test_the_gate_fails_a_15_percent_slowdown_and_passes_a_3_percent_one(runs, tmp_path):
    assert gate_failures(runs, tmp_path, 1.15, 20) == 20
    assert gate_failures(runs, tmp_path, 1.03, 20) == 0


def test_processes_are_the_unit_not_the_samples_of_one():
    # two processes per side, each tight but at its own level: the 11% move of the medians is
    # less than the spread between processes, so the samples' tightness proves nothing
    base = [[10.0 + 0.001 * i for i in range(10)], [12.0 + 0.001 * i for i in range(10)]]
    cur = [[11.2 + 0.001 * i for i in range(10)], [13.2 + 0.001 * i for i in range(10)]]
    assert compare_times(base, cur, 1.10, 0.05).verdict == "unchanged"
    # the same samples as one process per side would have been called significant
    assert compare_times([base[0]], [cur[0]], 1.10, 0.05).verdict == "regression"


def test_too_few_samples_is_inconclusive_not_pass():
    v = compare_times([[1.0, 1.1, 1.2]], [[2.0, 2.1, 2.2]], 1.10, 0.05)
    assert v.verdict == "inconclusive" and "at least 5 samples" in v.evidence
    five = [1.0, 1.01, 1.02, 1.03, 1.04]
    assert compare_times([five], [[2 * x for x in five]], 1.10, 0.05).verdict == "regression"
    assert compare_times([five], [[x / 2 for x in five]], 1.10, 0.05).verdict == "improvement"


# ---------------------------------------------------------------------------------------
# Time: a rerun is not flagged, a 30% slowdown is
# ---------------------------------------------------------------------------------------


def split_rerun(rows, seed, slowdown=1.0):
    """A rerun of the same code on the same machine: each trial's real samples shuffled with
    ``seed`` and cut in two halves, one for the baseline and one for the current side (the
    current half multiplied by ``slowdown`` to inject a regression)."""
    rng = random.Random(seed)
    base, cur = [], []
    for r in rows:
        samples = list(r["times_ms"])
        rng.shuffle(samples)
        half = len(samples) // 2
        for side, part, factor in ((base, samples[:half], 1.0), (cur, samples[half:], slowdown)):
            part = [x * factor for x in part]
            side.append({**r, "times_ms": part, **summarize(part)})
    return base, cur


def test_a_rerun_is_not_flagged_and_a_30_percent_slowdown_is_caught_in_20_seeded_trials(runs, tmp_path):
    timed = [r for r in rows_of(runs["base"]) if r["kind"] == "points"]
    assert len(timed) == 3 and all(len(r["times_ms"]) == 200 for r in timed)
    only_time = Thresholds(aspects=("time",))
    false_alarms, caught, flagged = 0, 0, 0
    for seed in range(20):
        base, cur = split_rerun(timed, seed)
        report = run_check(write_rows(tmp_path / f"b{seed}", base), write_rows(tmp_path / f"c{seed}", cur), only_time)
        assert len(report.findings) == 3
        false_alarms += report.exit_code != 0
        base, slow = split_rerun(timed, seed, slowdown=1.3)
        report = run_check(write_rows(tmp_path / f"b{seed}", base), write_rows(tmp_path / f"s{seed}", slow), only_time)
        caught += report.exit_code == 1
        flagged += sum(f.verdict == "regression" for f in report.findings)
    assert false_alarms <= 1, f"{false_alarms} of 20 reruns flagged"
    assert caught >= 19, f"the 30% slowdown failed the gate in only {caught} of 20 ({flagged} of 60 trials flagged)"


def test_injected_slowdown_fails_the_gate_with_exit_1(runs, tmp_path, capsys):
    # the current side is the base run with every raw sample multiplied by 1.3
    slow = [
        {**r, "times_ms": [x * 1.3 for x in r["times_ms"]]} if r["kind"] == "points" else r
        for r in rows_of(runs["base"])
    ]
    code, report = check_json(capsys, "--baseline", runs["base"], "--current", write_rows(tmp_path / "slow", slow))
    assert code == 1 and report["result"] == "fail"
    regressions = findings(report, "time", "regression")
    assert len(regressions) == 3
    assert all(
        math.isclose(f["numbers"]["ratio"], 1.3, rel_tol=1e-9) and f["numbers"]["p_value"] <= 0.05 for f in regressions
    )
    # the max-seq trials were left as they ran: unchanged, not inconclusive
    assert not findings(report, "time", "inconclusive")
    assert not [f for f in report["findings"] if f["verdict"] != "unchanged" and f["aspect"] != "time"]


# ---------------------------------------------------------------------------------------
# Memory, capacity, correctness
# ---------------------------------------------------------------------------------------


def test_a_5_percent_memory_increase_is_caught_and_1_percent_is_not(runs, tmp_path, capsys):
    base = rows_of(runs["base"])
    ran = [r for r in base if r["kind"] in ("points", "max-seq") and r["status"] == "ok" and r["peak_bytes"]]
    for factor, expected in ((1.05, 1), (1.01, 0)):
        # the current side is the base run with every peak multiplied by the factor
        more = [{**r, "peak_bytes": round(r["peak_bytes"] * factor)} if r.get("peak_bytes") else r for r in base]
        code, report = check_json(
            capsys,
            "--baseline",
            runs["base"],
            "--current",
            write_rows(tmp_path / f"m{factor}", more),
            "--only",
            "memory",
        )
        assert code == expected
        flagged = findings(report, "memory", "regression")
        assert len(flagged) == (len(ran) if expected else 0)
        assert all(math.isclose(f["numbers"]["ratio"], factor, rel_tol=1e-3) for f in flagged)


def test_a_hungrier_implementation_loses_one_bisection_step_and_its_memory_grows(runs, capsys):
    results = {
        name: [r for r in rows_of(runs[name]) if r["kind"] == "max-seq-result"][0] for name in ("base", "hungry")
    }
    assert results["base"]["seq_len"] - results["hungry"]["seq_len"] == STEP  # precondition: one step
    code, report = check_json(capsys, "--baseline", runs["base"], "--current", runs["hungry"])
    assert code == 1
    capacity = [f for f in findings(report, "capacity", "regression") if f["trial"].startswith("max-seq of naive")]
    assert len(capacity) == 1
    assert capacity[0]["numbers"] == {
        "baseline_max_seq": results["base"]["seq_len"],
        "current_max_seq": results["hungry"]["seq_len"],
    }
    # the length that ran before is now out of memory
    lost = [f for f in findings(report, "capacity", "regression") if f is not capacity[0]]
    assert [(f["numbers"]["seq_len"], f["current"]) for f in lost] == [(results["base"]["seq_len"], "oom")]
    # a third N x N buffer, half as much again as scores and probabilities: caught at 2K, the
    # length that ran on both sides (at 128 and 256 it is 128 KiB and 512 KiB, within the
    # resident set's noise)
    grown = {
        f["numbers"]["seq_len"]: f for f in findings(report, "memory", "regression") if f["trial"].startswith("naive")
    }
    assert grown[2048]["numbers"]["ratio"] > 1.25
    assert not findings(report, "correctness", "regression")


def test_a_wrong_output_is_caught(runs, capsys):
    code, report = check_json(capsys, "--baseline", runs["base"], "--current", runs["wrong"])
    assert code == 1
    wrong = findings(report, "correctness", "regression")
    assert [f["trial"].split()[0] for f in wrong] == ["naive"]
    assert wrong[0]["baseline"] == "pass" and wrong[0]["current"] == "fail" and wrong[0]["numbers"]["rel_err"] > 1e-4
    # naive was never swept, so its trials are missing, not compared
    assert any(m.startswith("naive") for m in report["missing"])
    assert findings(report, "correctness", "unchanged")  # sdpa still passes


def test_markdown_is_a_pull_request_comment(runs, capsys):
    code, md, _ = attnbench(
        capsys, "check", "--baseline", runs["base"], "--current", runs["hungry"], "--format", "markdown"
    )
    assert code == 1
    assert md.startswith("### ❌ attnbench check: FAIL")
    assert "| Verdict | Aspect | Trial | Device | Baseline | Current | Change | Evidence |" in md
    assert "| ❌ regression | capacity | max-seq of naive" in md
    assert "<details><summary>" in md and "unchanged</summary>" in md


def test_the_exit_code_of_the_command(runs):
    """The real console command, as CI calls it: a clean comparison exits 0, a regression 1."""
    same = run_cli("check", "--baseline", runs["base"], "--current", runs["base"])
    assert same.returncode == 0 and same.stdout.startswith("attnbench check: PASS"), same.stdout + same.stderr
    worse = run_cli("check", "--baseline", runs["base"], "--current", runs["hungry"])
    assert worse.returncode == 1 and "REGRESSION" in worse.stdout


# ---------------------------------------------------------------------------------------
# Device models
# ---------------------------------------------------------------------------------------


def test_different_device_models_are_never_compared(runs, tmp_path, capsys):
    # the hungry run, as if measured on another CPU model
    other = [
        {**r, "env": {**r["env"], "cpu": "Other CPU 9000", "machine": "cpu: Other CPU 9000"}}
        for r in rows_of(runs["hungry"])
    ]
    path = write_rows(tmp_path / "other", other)
    one_line_exit_2(
        attnbench(capsys, "check", "--baseline", runs["base"], "--current", path),
        "different device models are never compared",
    )
    # on CPUs, what does not depend on the CPU model still compares: the lost capacity is caught
    code, report = check_json(capsys, "--baseline", runs["base"], "--current", path, "--deterministic")
    assert code == 1 and findings(report, "capacity", "regression")
    assert {f["device_model"] for f in report["findings"] if f["aspect"] != "correctness"} == {"cpu (any model)"}
    assert not findings(report, "time") and not findings(report, "memory")


# ---------------------------------------------------------------------------------------
# Unusable input: one line, exit 2
# ---------------------------------------------------------------------------------------


def one_line_exit_2(result, hint):
    code, out, err = result
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and hint in lines[0], err
    assert "Traceback" not in err and out == ""


def test_missing_file_from_the_console_command(tmp_path, runs):
    proc = run_cli("check", "--baseline", tmp_path / "nope", "--current", runs["base"])
    one_line_exit_2((proc.returncode, proc.stdout, proc.stderr), "does not exist")


def test_missing_or_empty_files(runs, tmp_path, capsys):
    (tmp_path / "empty-dir").mkdir()
    one_line_exit_2(
        attnbench(capsys, "check", "--baseline", runs["base"], "--current", tmp_path / "empty-dir"), "no trials.jsonl"
    )
    (tmp_path / "empty.jsonl").write_text("")
    one_line_exit_2(
        attnbench(capsys, "check", "--baseline", runs["base"], "--current", tmp_path / "empty.jsonl"), "no result rows"
    )


def test_corrupt_lines_stop_the_check_unless_skipped(runs, tmp_path, capsys):
    lines = (runs["base"] / "trials.jsonl").read_text().splitlines(keepends=True)
    cut = tmp_path / "cut" / "trials.jsonl"
    cut.parent.mkdir()
    cut.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2] + "\n" + "".join(lines[4:]))
    one_line_exit_2(
        attnbench(capsys, "check", "--baseline", runs["base"], "--current", cut), f"{cut}:4: unreadable line"
    )
    # the skipped line's trial is then missing: that fails the gate unless allowed
    code, out, err = attnbench(
        capsys,
        "check",
        "--baseline",
        runs["base"],
        "--current",
        cut,
        "--skip-unreadable",
        "--only",
        "correctness,bytes",
    )
    assert code == 1 and "missing (baseline only): 1" in out, out + err
    code, out, err = attnbench(
        capsys,
        "check",
        "--baseline",
        runs["base"],
        "--current",
        cut,
        "--skip-unreadable",
        "--allow-missing",
        "--only",
        "correctness,bytes",
    )
    assert code == 0, out + err
    assert f"warning: current {cut}:4: unreadable line" in err


def test_nothing_in_common(runs, tmp_path, capsys):
    rows = rows_of(runs["base"])
    naive = write_rows(tmp_path / "naive", [r for r in rows if r["impl"] == "naive"])
    sdpa = write_rows(tmp_path / "sdpa", [r for r in rows if r["impl"] == "sdpa"])
    one_line_exit_2(
        attnbench(capsys, "check", "--baseline", naive, "--current", sdpa), "no trial or reference check in common"
    )


@pytest.mark.parametrize(
    "args, hint",
    [
        (["--format", "html"], "--format"),
        (["--only", "speed"], "choose from"),
        (["--deterministic", "--only", "time"], "--deterministic"),
        (["--time-factor", "0.9"], "at least 1.0"),
        (["--alpha", "0"], "--alpha"),
    ],
)
def test_bad_options(runs, args, hint, capsys):
    one_line_exit_2(attnbench(capsys, "check", "--baseline", runs["base"], "--current", runs["base"], *args), hint)


def test_a_time_limited_capacity_compares_within_one_bisection_step():
    from attnbench.check.compare import Comparison

    row = {"impl": "sdpa", "config": {}, "dtype": "bf16", "batch": 1, "heads": 8, "head_dim": 64, "mode": "fwd"}

    def search(largest, first_failure, stopped_by="time"):
        return {
            "complete": True,
            "stopped_by": stopped_by,
            "max_seq_len": largest,
            "first_failure": first_failure,
            "row": row,
        }

    def verdict(b, c):
        comparison = Comparison(None, None, Thresholds())
        comparison._capacity(b, c, "H100")
        return comparison.findings[0].verdict

    # the clock moved the time limit by one step of 64K: not a regression
    assert verdict(search(983040, 1048576), search(917504, 983040)) == "unchanged"
    # two steps is
    assert verdict(search(983040, 1048576), search(851968, 917504)) == "regression"
    # a memory limit is exact: one step is a regression
    assert verdict(search(983040, 1048576, "memory"), search(917504, 983040, "memory")) == "regression"
