"""End to end on the CPU: `attnbench max-seq` under --memory-limit stops on a real OOM,
an interrupted sweep keeps its trials and --resume finishes it without loss or repeats."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from attnbench.results import read_rows
from attnbench.results.schema import Environment, Trial
from attnbench.runtime.supervise import PAUSE_AFTER_TRIALS_ENV
from attnbench.sweeps.kinds.max_seq import outcome
from attnbench.sweeps.search import Limits, grow_then_bisect, predicted_search

from conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # real searches in fresh processes

LIMIT = 256 * 2**20
HEADS = 2


def trials(out: Path, kind="max-seq"):
    rows, problems = read_rows(out)
    assert problems == []
    return [r for r in rows if r.get("kind") == kind]


@pytest.fixture(scope="module")
def naive_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("naive") / "run"
    proc = run_cli(
        "max-seq",
        "--impl",
        "naive",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        HEADS,
        "--head-dim",
        16,
        "--memory-limit",
        "256MiB",
        "--start",
        "1K",
        "--resolution",
        128,
        "--max-trial-seconds",
        30,
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_naive_stops_on_a_real_oom_where_its_n_squared_memory_says(naive_sweep):
    out, proc = naive_sweep
    rows = trials(out)
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    assert failed and all(r["status"] == "oom" for r in failed), [r["message"] for r in failed]
    # a length that ran once but failed its fresh-process confirmation does not stand
    best = max(r["seq_len"] for r in ok if r["seq_len"] not in {f["seq_len"] for f in failed})
    # the scores and probabilities alone are 2 * H * N^2 float32 values
    assert 2 * HEADS * 4 * best**2 <= LIMIT
    first_fail = min(r["seq_len"] for r in failed if r["seq_len"] > best)
    assert first_fail - best <= 128
    # and the limit is what stopped it: a failure well below the N^2 bound would be a bug
    assert 2 * HEADS * 4 * first_fail**2 >= LIMIT / 4
    result = [r for r in read_rows(out)[0] if r["kind"] == "max-seq-result"]
    assert result and result[0]["seq_len"] == best and result[0]["stopped_by"] == "memory"
    assert "stopped by memory" in proc.stdout


def test_rows_carry_environment_samples_and_memory(naive_sweep):
    out, _ = naive_sweep
    for r in trials(out):
        env = r["env"]
        for key in ("torch", "commit", "date", "command", "machine", "python", "cpu"):
            assert env.get(key), key
        assert r["floor_bytes"] == 4 * r["seq_len"] * HEADS * 16 * 4
        if r["status"] == "ok":
            assert len(r["times_ms"]) >= 1 and r["time_ms"] > 0
            assert r["peak_bytes"] > r["floor_bytes"]  # naive holds N^2 scores on top
            assert r["inputs_bytes"] > 0 and r["tokens_per_s"] > 0 and r["tflops_executed"] > 0


def test_tables_follow_the_seed_layout(naive_sweep):
    out, _ = naive_sweep
    md = (out / "sweep.md").read_text()
    assert "| Sequence Length | Memory After QKV | Peak Memory | Result | Notes |" in md
    assert "| Sequence Length | Eager Time | GPU Time | Peak Memory | Result | Sparsity |" in md
    assert "✗ OOM" in md and "✓ Success" in md
    csv = (out / "trials.csv").read_text().splitlines()
    assert csv[0].startswith("run,label,impl")
    assert len(csv) == 1 + len(trials(out))


def test_existing_results_are_not_overwritten(naive_sweep, in_process):
    out, _ = naive_sweep
    before = (out / "trials.jsonl").read_bytes()
    proc = in_process("max-seq", "--impl", "naive", "--device", "cpu", "--out", out)
    assert proc.returncode == 2 and "--resume" in proc.stderr
    assert (out / "trials.jsonl").read_bytes() == before


def test_interrupt_then_resume_loses_and_repeats_nothing(tmp_path, in_process):
    out = tmp_path / "run"
    args = [
        "max-seq",
        "--impl",
        "dilated",
        "--segment-lengths",
        "64,128",
        "--dilation-rates",
        "1,2",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        2,
        "--head-dim",
        16,
        "--memory-limit",
        "192MiB",
        "--start",
        "1K",
        "--resolution",
        "16K",
        "--out",
        out,
    ]
    # the sweep waits for a signal once it has recorded 3 trials (its search has more to do):
    # the interrupt lands there however slow the machine, never after the search ended
    env = {**os.environ, "PYTHONPATH": str(ROOT), PAUSE_AFTER_TRIALS_ENV: "3"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnbench", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while proc.poll() is None and (not (out / "trials.jsonl").exists() or len(trials(out)) < 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr
    kept = trials(out)
    assert len(kept) == 3
    assert not any(r["kind"] == "max-seq-result" for r in read_rows(out)[0])

    # `--resume --out DIR` alone: the command the rows recorded runs again (through the entry
    # point in this process; each of its trials in a fresh process, as the interrupted one's)
    done = in_process("max-seq", "--resume", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "resuming: attnbench max-seq --impl dilated" in done.stderr
    assert "(from earlier run)" in done.stdout
    rows = trials(out)
    attempts = [(r["seq_len"], r["attempt"]) for r in rows]
    assert len(attempts) == len(set(attempts)), "a trial ran twice"
    assert {r["trial"] for r in kept} <= {r["trial"] for r in rows}, "a finished trial was lost"
    (result,) = [r for r in read_rows(out)[0] if r["kind"] == "max-seq-result"]
    # the resumed search made the decisions a search without interruption makes from these
    # outcomes: replaying it over the recorded rows asks for exactly the recorded trials
    replay = replay_search(rows, Limits(1024, 128, 1 << 31, resolution=16384, degree=1, time_limit_ms=60_000.0))
    assert sorted(replay.tried) == sorted((r["seq_len"], r["status"]) for r in rows)
    assert (replay.best, replay.first_failure, replay.confirmed) == (
        result["seq_len"],
        result["first_failure"],
        result["confirmed"],
    )


def replay_search(rows, limits):
    """The predicted search over recorded trial rows, each outcome as the sweep computed it."""
    recorded = {(r["seq_len"], r["attempt"]): r for r in rows}
    seen = []

    def probe(n, phase, attempt, prediction):
        seen.append(Trial.from_json(recorded[(n, attempt)]))
        return outcome(seen[-1], seen)

    return predicted_search(probe, limits)


# Each under a memory limit that the address-space cap of the trial's process enforces: what
# stops the search is the allocator failing, not a model of it. Where the caps fall depends on
# the CPU (its math library's buffers): MiB where a length fails / runs, on a 2-core Xeon: naive
# 2304 92/96, 2560 112/116; sdpa 5120 40/42, 6144 48/50; dilated 98304 56/58, 131072 74/80; on a
# 2-core AMD EPYC naive 2560 runs from 104. So the search's length and its trial count are the
# machine's: the test holds the predicted search to the blind one on the same machine, and
# tests/test_search.py holds the trial count on a deterministic device. Memory that grows as N^2
# (naive's scores) and as N (dilated's segments; sdpa's CPU kernel grows as N too, so it was a
# third search of the same shape and is left out: each case runs two searches in real processes).
CAPACITY_CASES = {
    "naive": ({"memory_limit": "104MiB", "start": 512, "resolution": 256}, {}),
    "dilated": (
        {"memory_limit": "68MiB", "start": 16384, "resolution": 32768},
        {"segment_lengths": [256, 512], "dilation_rates": [1, 2]},
    ),
}


@pytest.mark.parametrize("impl", list(CAPACITY_CASES))
def test_the_predicted_search_reaches_the_blind_searchs_length_in_real_processes(impl, tmp_path):
    from attnbench.plan import build_plan
    from attnbench.sweeps.runner import SweepRunner, resolve
    from attnbench.trials.trial import run_isolated

    flags, params = CAPACITY_CASES[impl]
    settings = {"kind": "max-seq", "device": "cpu", "dtype": "fp32", "heads": 2, "head_dim": 16, "warmup": 0}
    settings |= {"min_samples": 1, "max_samples": 1, "target_ms": 0, "max_trial_seconds": 60}
    # the search alone: the reference check at the sweep's heads (H=8, D=64 for sdpa) needs more
    # than the limit these cases are sized to (tests/test_reliability.py holds that refusal)
    plan = resolve(replace(build_plan("t", [impl], {**settings, **flags}, params), verify=False))
    (outcome_,) = SweepRunner(plan, tmp_path / "run", Environment(machine="cpu: test")).run()
    found = outcome_.result
    rows = trials(tmp_path / "run")
    assert len(rows) == len(found.tried)
    failed = [r for r in rows if r["status"] != "ok"]
    assert failed and all(r["status"] == "oom" and "allocate" in r["message"] for r in failed)
    assert found.confirmed and found.stop_status == "oom"
    # today's blind search (double, then bisect), every probe in a fresh process as well
    s, runner = plan.series[0], SweepRunner(plan, tmp_path / "blind", Environment(machine="cpu: test"))
    blind = grow_then_bisect(
        lambda n, phase: run_isolated(runner.spec(s, n)).status,
        s.start(),
        s.granularity(),
        s.settings.search.max_seq_len,
        s.settings.search.resolution,
    )
    gap = max(s.granularity(), s.settings.search.resolution)
    assert abs(found.best - blind.best) <= gap, (found.tried, blind.tried)
