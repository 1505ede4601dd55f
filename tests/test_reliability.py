"""Results that never lie after a crash, a resume or bad input (issue 22), and the failure
classes of a trial (issue 16, part 5). Each test states the defect it guards against."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench import results
from attnbench.errors import AttnbenchError, Terminated
from attnbench.plan import build_plan, parse_settings
from attnbench.results import ResultsWriter, read_rows, write_text_atomic
from attnbench.results.schema import Environment, Measured
from attnbench.sweeps import runner as runner_mod
from attnbench.sweeps.runner import SweepRunner, resolve
from attnbench.sweeps.session import SilentReporter
from attnbench.trials.workload import Workload

from conftest import ROOT, main_in_process, run_cli

ENV = {"machine": "cpu: test"}
FIXTURE = Path(__file__).parent / "fixtures" / "results" / "cpu-tiny" / "trials.jsonl"


def fixture_row(kind: str, **fields) -> dict:
    """A complete row of this kind from the committed fixture run (the schema validates rows)."""
    row = next(r for r in map(json.loads, FIXTURE.read_text().splitlines()) if r["kind"] == kind)
    return row | fields


CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", 1, "--head-dim", 8]


class Recorder(SilentReporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def plan(impls=("naive",), **flags):
    base = {
        "kind": "max-seq",
        "device": "cpu",
        "dtype": "fp32",
        "heads": 1,
        "head_dim": 8,
        "start": 128,
        "max_seq_len": 256,
        "isolate": False,
        "min_samples": 1,
        "max_samples": 2,
        "target_ms": 0,
        "warmup": 0,
    }
    return resolve(build_plan("t", list(impls), {**base, **flags}, {}))


def sweep(out: Path, resume: bool = False, env: dict | None = None, **flags) -> Recorder:
    rec = Recorder()
    SweepRunner(plan(**flags), out, Environment(**(env or ENV)), resume=resume, reporter=rec).run()
    return rec


def kinds(out: Path) -> dict[str, list[dict]]:
    rows, problems = read_rows(out)
    assert not problems
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["kind"], []).append(r)
    return by


def fake_trials(monkeypatch, status_of):
    """Replace the in-process trial with ``status_of(seq_len, attempt_number)``."""
    calls: dict[int, int] = {}

    def execute(spec, phase=None):
        n = spec.workload.seq_len
        calls[n] = calls.get(n, 0) + 1
        status = status_of(n, calls[n])
        return Measured(status=status, message="" if status == "ok" else f"injected {status}", times_ms=[1.0])

    monkeypatch.setattr(runner_mod, "execute", execute)
    return calls


# --- 1. resume identity ------------------------------------------------------------------


def test_resume_under_other_limits_measures_again_and_says_so(tmp_path):
    out = tmp_path / "run"
    sweep(out)
    first = kinds(out)
    assert {r["seq_len"] for r in first["max-seq"]} == {128, 256}
    rec = sweep(out, resume=True, max_trial_seconds=30)
    again = [r for r in kinds(out)["max-seq"] if r["max_trial_seconds"] == 30]
    assert sorted(r["seq_len"] for r in again) == [128, 256, 256]  # 256: the answer and its confirmation
    assert any("measuring again" in n and "256" in n for n in rec.notes), rec.notes
    rec = sweep(out, resume=True, max_trial_seconds=30, memory_limit="1GiB")
    assert sorted(r["seq_len"] for r in kinds(out)["max-seq"] if r["memory_limit"] == 2**30) == [128, 256, 256]


def test_resume_replays_only_this_machines_rows(tmp_path):
    """A file that also holds another machine's trials of the same series: they are not this
    machine's measurements, so the search runs here and its answer is this machine's own."""
    out = tmp_path / "run"
    sweep(out, env={"machine": "NVIDIA H100 80GB HBM3 x1"})
    elsewhere = kinds(out)
    this_machine = elsewhere["verify"][0] | {"env": ENV, "trial": "here"}
    with (out / "trials.jsonl").open("a") as f:
        f.write(json.dumps(this_machine) + "\n")
    sweep(out, resume=True)
    ours = [r for rows in kinds(out).values() for r in rows if r["env"] == ENV]
    assert sorted(r["seq_len"] for r in ours if r["kind"] == "max-seq") == [128, 256, 256]
    assert [r["seq_len"] for r in ours if r["kind"] == "max-seq-result"] == [256]


@pytest.mark.parametrize("field", ["seq_len", "first_failure", "max_seq_len"])
def test_a_length_beyond_any_device_is_skipped_by_every_reader(tmp_path, field):
    """One rule where rows are read: report, check, predict and resume all go through it."""
    row = fixture_row("max-seq-result", **{field: 10**18})
    (tmp_path / "trials.jsonl").write_text(json.dumps(row) + "\n")
    rows, problems = read_rows(tmp_path)
    assert rows == [] and len(problems) == 1 and field in problems[0] and ":1:" in problems[0]


def test_a_trial_that_ran_with_inputs_beyond_its_device_is_skipped(tmp_path):
    row = fixture_row("points", status="ok", batch=10**9, floor_bytes=10**18)
    (tmp_path / "trials.jsonl").write_text(json.dumps(row) + "\n")
    rows, problems = read_rows(tmp_path)
    assert rows == [] and "floor_bytes" in problems[0]


# --- 12 (minor). a resume repeats no reference check and no search result ----------------


def test_resume_with_nothing_to_do_appends_nothing(tmp_path):
    out = tmp_path / "run"
    sweep(out)
    before = kinds(out)
    rec = sweep(out, resume=True)
    after = kinds(out)
    assert {k: len(v) for k, v in after.items()} == {k: len(v) for k, v in before.items()}
    assert len(after["verify"]) >= 1 and len(after["max-seq-result"]) == 1
    assert not rec.notes


def test_a_value_error_reads_as_one_sentence():
    with pytest.raises(AttnbenchError) as exc:
        parse_settings({"start": "lots"}, "command line")
    text = str(exc.value)
    assert "must be cannot" not in text and "16K" in text and "--start" in text  # the option, as typed


def test_the_readme_does_not_promise_a_few_percent_of_cpu_memory_noise():
    readme = (ROOT / "README.md").read_text()
    gate = (ROOT / "docs" / "reference" / "regression-gate.md").read_text()
    assert "moves by a few percent between runs" not in readme + gate
    # the gate's CPU memory is the exact tensor count; resident-set growth moves by tens of MiB
    assert "tensor bytes a call held" in gate and "tens of MiB" in gate


# --- 2. a torn last line is repaired before appending ------------------------------------


def test_a_torn_last_line_is_kept_apart_and_the_next_row_starts_its_own_line(tmp_path):
    path = tmp_path / "trials.jsonl"
    good = json.dumps(fixture_row("verify", impl="naive", status="pass"))
    fragment = '{"schema": 1, "kind": "max-se'
    path.write_text(good + "\n" + good + "\n" + fragment)
    warnings = []
    sdpa = {k: v for k, v in fixture_row("verify", impl="sdpa", status="pass").items() if k != "schema"}
    ResultsWriter(tmp_path, warn=warnings.append).append(sdpa)
    rows, problems = read_rows(path)
    assert problems == [] and [r["impl"] for r in rows] == ["naive", "naive", "sdpa"]
    assert (tmp_path / "trials.jsonl.torn").read_text() == fragment + "\n"
    assert warnings == [f"{path}:3: torn last line ({len(fragment)} bytes) moved to {path}.torn"]


# --- 3. an interrupted search is a lower bound everywhere --------------------------------


def test_an_interrupted_search_is_shown_as_incomplete(tmp_path, monkeypatch, capsys):
    from attnbench.cli.sweep import _print_summary
    from attnbench.report.build import write_report
    from attnbench.report.run_files import write_run_files

    def status(n, attempt):
        if n == 384:
            raise KeyboardInterrupt  # the user stops the sweep during the bisection
        return "ok" if n <= 256 else "oom"

    fake_trials(monkeypatch, status)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        sweep(out, max_seq_len=4096)
    write_run_files(out)
    md = (out / "sweep.md").read_text()
    assert "≥ 256" in md and "search interrupted" in md and "memory" not in md.split("## naive")[0]
    _print_summary(out)
    console = capsys.readouterr().out
    assert "≥ 256" in console and "search interrupted" in console
    report = write_report(out, tmp_path / "report").report.read_text()
    answer = report.split("## The answer")[1].split("\n## ")[0]
    assert "| ≥ 256 | search interrupted |" in answer  # the answer's length is a lower bound too


@pytest.mark.parametrize("kind", ["max-seq", "speedup"])
def test_a_trial_stopped_by_an_interrupt_leaves_no_progress_display_running(tmp_path, monkeypatch, kind):
    """A trial that raises stops its progress display as a finished one does. Before, a
    log's heartbeat thread lived on after an interrupt and printed "... 680 s: ..." into
    whatever the process ran next (another command in the same process)."""
    import threading

    from attnbench.cli import base
    from attnbench.cli.progress import HEARTBEAT_THREAD, RichReporter, SpeedupReporter
    from attnbench.plan import Case, Plan, speedup_series
    from attnbench.runtime import distributed
    from attnbench.runtime.worker import PHASE_LISTENERS
    from attnbench.sweeps.kinds.speedup import runner as speedup_runner

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(base.console, "_force_terminal", False)  # a log: the display is a thread
    if kind == "speedup":
        monkeypatch.setattr(distributed, "launch", interrupted)
        series = speedup_series("sdpa", {}, cases=(Case(256, 2),), gpus=2, device="cpu", dtype="fp32")
        run = Plan("t", (speedup_runner.check_settings(series, cuda_devices=0),))
    else:
        monkeypatch.setattr(runner_mod, "execute", interrupted)
        run = plan()
    listeners = list(PHASE_LISTENERS)
    runner = SweepRunner(
        run, tmp_path / "run", Environment(**ENV), False, reporter=RichReporter(), speedup_reporter=SpeedupReporter()
    )
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert [t for t in threading.enumerate() if t.name == HEARTBEAT_THREAD] == []
    assert PHASE_LISTENERS == listeners


# --- 4. every output path is checked before any work -------------------------------------


def one_line_exit_2(proc, hint: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and hint in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_out_that_is_a_file_stops_before_the_reference_check(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    proc = run_cli("max-seq", "--impl", "naive", *CPU, "--out", target)
    one_line_exit_2(proc, "is a file")
    assert "reference check" not in proc.stdout
    assert target.read_text() == "keep me"


@pytest.mark.slow
def test_report_out_that_is_a_file_and_a_png_named_otherwise(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    one_line_exit_2(run_cli("report", tmp_path, "--out", target), "is a file")
    one_line_exit_2(run_cli("pattern", "--seq-len", "1024", "--png", tmp_path / "x.txt"), ".png")
    assert not (tmp_path / "x.txt").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_out_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        one_line_exit_2(run_cli("max-seq", "--impl", "naive", *CPU, "--out", ro / "run"), "not writable")
    finally:
        ro.chmod(0o700)


# --- 5. tolerant readers -----------------------------------------------------------------


def test_undecodable_and_incomplete_rows_are_skipped_with_file_and_line(tmp_path):
    path = tmp_path / "trials.jsonl"
    good = json.dumps(fixture_row("verify", impl="naive", status="pass")).encode()
    probe = fixture_row("max-seq")
    assert "status" in probe
    no_status = json.dumps({k: v for k, v in probe.items() if k != "status"}).encode()
    path.write_bytes(good + b"\n" + b'{"kind": "verify", "impl": "na\xffve"}\n' + no_status + b"\n" + good + b"\n")
    rows, problems = read_rows(path)
    assert len(rows) == 2
    assert [p.split(": ")[0] for p in problems] == [f"{path}:2", f"{path}:3"]
    assert "UTF-8" in problems[0] and "'status'" in problems[1]


def test_an_unknown_schema_is_refused_with_one_line(tmp_path):
    path = tmp_path / "trials.jsonl"
    path.write_text(json.dumps({"schema": 2, "kind": "verify", "impl": "naive", "status": "pass"}) + "\n")
    with pytest.raises(AttnbenchError, match=r"trials.jsonl:1: result schema 2"):
        read_rows(path)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "run"
    SweepRunner(plan(impls=("naive", "sdpa")), out, Environment(**ENV)).run()
    return out


@pytest.mark.slow
def test_report_and_check_survive_an_undecodable_byte(small_run, tmp_path):
    from attnbench.check import Thresholds, run_check

    bad = tmp_path / "bad"
    shutil.copytree(small_run, bad)
    with open(bad / "trials.jsonl", "ab") as f:
        f.write(b'{"kind": "\xff"}\n')
    proc = run_cli("report", bad, "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stderr
    assert f"{bad / 'trials.jsonl'}:" in proc.stderr and "UTF-8" in proc.stderr
    with pytest.raises(AttnbenchError, match="--skip-unreadable"):
        run_check(small_run, bad, Thresholds(aspects=("correctness", "capacity", "bytes")))
    report = run_check(small_run, bad, Thresholds(aspects=("correctness", "capacity", "bytes")), skip_unreadable=True)
    assert report.exit_code == 0 and any("UTF-8" in w for w in report.warnings)


# --- 6. the reference check runs isolated, under the trials' limits ----------------------


@pytest.mark.slow
def test_a_reference_check_too_big_for_the_memory_limit_is_one_line(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "max-seq",
        "--impl",
        "naive",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        # q, k, v and the output fit this machine at 1K (2.1 GB), but the float64 reference's
        # q, k and v alone (3 x 131 MB) do not fit the 256 MiB limit
        "--heads",
        2000,
        "--head-dim",
        64,
        "--start",
        "1K",
        "--memory-limit",
        "256MiB",
        "--out",
        out,
    )
    one_line_exit_2(proc, "reference check ran out of memory under --memory-limit 256 MiB")
    assert "its largest case, naive at N=" in proc.stderr and "raise --memory-limit above that" in proc.stderr
    assert not out.exists()


# --- 7. trials die with their parent; their temp dirs go -------------------------------

PARENT = """
import sys
import attnbench.runtime.worker as w
sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid()) + ' ' + sys.argv[2]); time.sleep(3600)"
w.python_module = lambda module, *args: [sys.executable, "-c", sleeper, sys.argv[1], args[-1]]
from attnbench.measure.timing import TimingPolicy
from attnbench.trials.trial import TrialSpec, trial_job
from attnbench.trials.workload import Workload
w.run_in_child(trial_job, TrialSpec(workload=Workload('naive')), 3600)
"""


def wait_for(condition, what: str, limit_s: float = 300.0) -> None:
    """Wait for an event (not a time): the limit only stops a broken test from hanging."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_trial_dies_with_its_parent_and_its_temp_dir_is_removed(tmp_path):
    from attnbench.runtime.worker import alive as _alive
    from attnbench.runtime.worker import remove_orphaned_temp_dirs

    info = tmp_path / "child.txt"
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(info)], env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp_root)}
    )
    wait_for(lambda: info.exists() and info.read_text().count(" ") == 1, "the trial to start")
    child_pid, result_path = info.read_text().split(" ")
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_for(lambda: not _alive(int(child_pid)) or _zombie(int(child_pid)), "the trial to die with its parent")
    trial_dir = Path(result_path).parent
    assert trial_dir.exists() and trial_dir.parent == temp_root  # SIGKILL left it behind
    assert remove_orphaned_temp_dirs(temp_root) == [trial_dir]
    assert not trial_dir.exists()


RANKS_PARENT = """
import sys
from attnbench.runtime.distributed import launch
from worker_jobs import Folder, sleep_forever
launch(sleep_forever, Folder(sys.argv[1]), 2, "cpu", 3600)
"""


@pytest.mark.distributed
def test_the_ranks_of_a_multi_process_job_die_with_attnbench_and_their_temp_dir_goes(tmp_path):
    # attnbench -> torchrun agent -> two gloo ranks; a SIGKILL of attnbench leaves none of them,
    # and the job's temp dir it left behind is removed by the next run (as speedup's are)
    from attnbench.runtime.worker import alive as _alive
    from attnbench.runtime.worker import remove_orphaned_temp_dirs

    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "TMPDIR": str(temp_root)}
    parent = subprocess.Popen([sys.executable, "-c", RANKS_PARENT, str(tmp_path)], env=env)
    pid_files = [tmp_path / f"rank{r}.pid" for r in (0, 1)]
    wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files), "both ranks to start")
    ranks = [int(p.read_text()) for p in pid_files]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_for(lambda: not any(_alive(pid) and not _zombie(pid) for pid in ranks), "the ranks to die with attnbench")
    left = sorted(temp_root.glob("attnbench-*"))  # (torchrun's own torchelastic_* dir is torch's)
    assert left  # SIGKILL left the job's dir behind
    assert sorted(remove_orphaned_temp_dirs(temp_root)) == left and not list(temp_root.glob("attnbench-*"))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


# --- failure classes (issue 16, part 5) ----------------------------------------------------


def test_a_sigkill_is_the_oom_killer_only_with_evidence():
    from attnbench.runtime.supervise import classify_exit as _classify_exit

    plain = _classify_exit(-signal.SIGKILL, [], {"oom_kills": (3, 3), "rss_peak": 10 << 20, "memory_limit": 1 << 30})
    assert plain.status == "killed"
    counted = _classify_exit(-signal.SIGKILL, [], {"oom_kills": (3, 4), "rss_peak": 0, "memory_limit": None})
    assert counted.status == "host-oom" and "from 3 to 4" in counted.message
    at_limit = _classify_exit(
        -signal.SIGKILL, [], {"oom_kills": (None, None), "rss_peak": 1 << 30, "memory_limit": 1 << 30}
    )
    assert at_limit.status == "host-oom"
    assert _classify_exit(-signal.SIGTERM, [], {}).status == "killed"
    assert (
        _classify_exit(1, ["RuntimeError: cuDNN Frontend error: No valid execution plans built."]).status
        == "unsupported"
    )
    assert _classify_exit(1, ["torch.OutOfMemoryError: CUDA out of memory."]).status == "oom"
    assert _classify_exit(1, ["ValueError: bad"]).status == "error"


def test_a_real_signal_from_outside_is_killed_not_out_of_memory():
    from attnbench.runtime.supervise import supervise as _supervise

    out = _supervise([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], 600)
    assert out.status in ("killed", "host-oom")  # host-oom only if the cgroup really killed something
    if out.status == "host-oom":
        assert "oom_kill count rose" in out.message


def test_ranks_that_left_no_result_take_the_class_of_the_launcher_exit():
    from attnbench.runtime.distributed import agreed_status
    from attnbench.runtime.jobs import RankEnded

    def ranks(outcome):
        return [RankEnded(r, "killed", "no result", outcome=outcome, failed_at=r) for r in (0, 1)]

    assert [agreed_status(ranks(o))[0] for o in ("host-oom", "killed", "time-limit", "error")] == [
        "host-oom",
        "killed",
        "time-limit",
        "error",
    ]


def test_an_unsupported_shape_is_its_own_class():
    from attnbench.measure.oom import classify

    assert (
        classify(RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No valid execution plans built."))
        == "unsupported"
    )
    assert classify(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    assert classify(RuntimeError("shapes do not match")) == "error"


class ScriptedTimer:
    """Each call takes the next scripted time (ms), whatever the step does."""

    script: list[float] = []

    def __init__(self, device):
        self.name, self.cuda = "scripted", False
        self.times = list(self.script)

    def __call__(self, fn):
        fn()
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]


@pytest.mark.parametrize("first_ms, status", [(1000.0, "ok"), (5000.0, "time-limit")])
def test_on_the_cpu_the_time_limit_is_decided_on_the_first_call(monkeypatch, first_ms, status):
    """A cold CPU call is a warm one (the CUDA rule, a warm call deciding, is test_measure's)."""
    import attnbench.trials.placed_job as placed_job
    from attnbench.measure.timing import TimingPolicy
    from attnbench.trials.trial import TrialSpec, execute

    monkeypatch.setattr(ScriptedTimer, "script", [first_ms, 1.0])
    monkeypatch.setattr(placed_job, "Timer", ScriptedTimer)  # the timer the one measure builds
    wl = {
        "impl": "naive",
        "config": {},
        "batch": 1,
        "seq_len": 128,
        "heads": 1,
        "head_dim": 8,
        "dtype": "fp32",
        "device": "cpu",
        "mode": "fwd",
        "causal": False,
    }
    row = execute(
        TrialSpec(
            workload=Workload(**wl),
            max_trial_seconds=2.0,
            timing=TimingPolicy(warmup=0, min_samples=1, max_samples=2, target_ms=0, budget_s=2.0),
        )
    )
    assert row.status == status, row
    assert row.first_call_ms == first_ms and (row.times_ms == []) == (status == "time-limit")


def test_a_failed_probe_is_retried_once_in_a_fresh_trial_and_both_are_rows(tmp_path, monkeypatch):
    # 256 fails once (a flake), 1024 fails twice (the real limit)
    fake_trials(monkeypatch, lambda n, attempt: "ok" if n < 1024 and (n != 256 or attempt > 1) else "killed")
    out = tmp_path / "run"
    sweep(out, max_seq_len=4096)
    trials = kinds(out)["max-seq"]
    at = {n: [(r["attempt"], r["status"]) for r in trials if r["seq_len"] == n] for n in (256, 1024)}
    assert at == {256: [(1, "killed"), (2, "ok")], 1024: [(1, "killed"), (2, "killed")]}
    result = kinds(out)["max-seq-result"][0]
    # bisection between 512 and 1024 at granularity 128: 768 and 896 run
    assert result["seq_len"] == 896 and result["first_failure"] == 1024 and result["stopped_by"] == "killed"


# --- 8. the gate has no holes --------------------------------------------------------------


def copy_rows(src: Path, dst: Path, keep=lambda r: True, change=lambda r: r) -> Path:
    rows, _ = read_rows(src)
    dst.mkdir(parents=True)
    text = "".join(json.dumps(change({k: v for k, v in r.items() if k != "_file"})) + "\n" for r in rows if keep(r))
    (dst / "trials.jsonl").write_text(text)
    return dst


def test_the_gate_fails_on_missing_trials_and_reference_checks(small_run, tmp_path):
    from attnbench.check import Thresholds, run_check

    det = ("correctness", "capacity", "bytes")
    # every sdpa trial and its search result gone, its reference check still there
    fewer = copy_rows(small_run, tmp_path / "fewer", keep=lambda r: r["impl"] != "sdpa" or r["kind"] == "verify")
    assert run_check(small_run, fewer, Thresholds(aspects=det)).exit_code == 1
    assert run_check(small_run, fewer, Thresholds(aspects=det, allow_missing=True)).exit_code == 0
    unchecked = copy_rows(small_run, tmp_path / "unchecked", keep=lambda r: r["kind"] != "verify")
    report = run_check(small_run, unchecked, Thresholds(aspects=det))
    assert report.exit_code == 1 and any("reference check" in m for m in report.missing)
    unchecked_base = copy_rows(small_run, tmp_path / "unchecked-base", keep=lambda r: r["kind"] != "verify")
    assert run_check(unchecked_base, unchecked, Thresholds(aspects=det)).exit_code == 1


def test_the_gate_refuses_result_sets_that_share_no_series(small_run, tmp_path):
    from attnbench.check import Thresholds, run_check

    def other(r):
        return {**r, "heads": 3, "series": "other"} if r["kind"] != "verify" else r

    unrelated = copy_rows(small_run, tmp_path / "unrelated", change=other)
    with pytest.raises(AttnbenchError, match="in common"):
        run_check(small_run, unrelated, Thresholds(aspects=("correctness", "capacity", "bytes")))


# --- 9. one run at a time per results directory ------------------------------------------


def test_a_second_run_into_a_locked_directory_stops_with_one_line(tmp_path):
    from attnbench.results import ResultsLock

    out = tmp_path / "run"
    with ResultsLock(out):
        with pytest.raises(AttnbenchError, match="another attnbench run is writing to"):
            sweep(out)
    assert not (out / "trials.jsonl").exists()
    sweep(out)  # released: the next run proceeds
    assert kinds(out)["max-seq"]


# --- 10. invalid values are bad input ------------------------------------------------------


def profile_with(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(f'device = "cpu"\ndtype = "fp32"\n{line}\n[[sweep]]\nimpl = "naive"\n')
    return path


INVALID = {
    "max-seq-len 0": (["max-seq", "--impl", "naive", *CPU, "--max-seq-len", "0"], "positive length"),
    "max-seq-len below start": (
        ["max-seq", "--impl", "naive", *CPU, "--start", "2048", "--max-seq-len", "1024"],
        "below the first length",
    ),
    "nan seconds": (["max-seq", "--impl", "naive", *CPU, "--max-trial-seconds", "nan"], "--max-trial-seconds"),
    "infinite seconds": (["max-seq", "--impl", "naive", *CPU, "--max-trial-seconds", "inf"], "--max-trial-seconds"),
    "verify where nothing runs": (["verify", "--impl", "context-parallel", "--device", "cpu"], "attnbench list"),
    "speedup over more processes than cores": (
        ["speedup", "--impl", "naive", "--device", "cpu", "--gpus", (os.cpu_count() or 1) + 1],
        "cores",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_values_are_exit_2(name, tmp_path):
    args, hint = INVALID[name]
    out = tmp_path / "out"
    one_line_exit_2(run_cli(*args, "--out", out), hint)
    assert not out.exists()


@pytest.mark.parametrize("line", ["min_samples = -1", "warmup = -2", "target_ms = -5.0", "max_trial_seconds = 0"])
def test_negative_profile_counts_are_exit_2(tmp_path, line):
    from attnbench.plan import build_plan as build

    with pytest.raises(AttnbenchError, match=line.split(" ")[0]):
        build("p", [], {}, {}, str(profile_with(tmp_path, line)))


@pytest.mark.slow
def test_verify_out_into_another_machines_directory(tmp_path):
    out = tmp_path / "gpu-run"
    out.mkdir()
    row = fixture_row("verify", impl="naive", status="pass")
    row["env"] = row["env"] | {"machine": "NVIDIA H100 80GB HBM3 x1"}
    (out / "trials.jsonl").write_text(json.dumps(row) + "\n")
    before = (out / "trials.jsonl").read_text()
    one_line_exit_2(run_cli("verify", "--impl", "naive", "--device", "cpu", "--dtype", "fp32", "--out", out), "H100")
    assert (out / "trials.jsonl").read_text() == before


# --- 11. symlink hygiene -------------------------------------------------------------------


def test_a_planted_link_at_a_temporary_name_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    out = tmp_path / "run"
    out.mkdir()
    (out / ".sweep.md.tmp").symlink_to(victim)  # the name the old writer used
    write_text_atomic(out / "sweep.md", "# table\n")
    assert victim.read_text() == "untouched"
    assert (out / "sweep.md").read_text() == "# table\n" and not (out / "sweep.md").is_symlink()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_resume_refuses_a_symlinked_results_file(tmp_path, small_run):
    out = tmp_path / "run"
    out.mkdir()
    (out / "trials.jsonl").symlink_to(small_run / "trials.jsonl")
    before = (small_run / "trials.jsonl").read_bytes()
    with pytest.raises(AttnbenchError, match="symbolic link"):
        sweep(out, resume=True, max_trial_seconds=7)
    assert (small_run / "trials.jsonl").read_bytes() == before


def test_git_keeps_its_ownership_protection():
    import inspect

    assert "safe.directory" not in inspect.getsource(results)


@pytest.mark.slow
def test_sigterm_stops_a_run_as_an_interrupt_does_and_exits_143(tmp_path):
    out = tmp_path / "run"
    lens = ",".join(str(128 * k) for k in range(1, 33))  # more trials than run before the signal
    args = ["bench", "--impl", "naive", "--seq-lens", lens, *CPU, "--out", out]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnbench", *map(str, args)], env=env, stderr=subprocess.PIPE, text=True
    )
    trials = out / "trials.jsonl"
    wait_for(lambda: trials.exists() and '"points"' in trials.read_text(), "a first trial")
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted: every finished trial is kept" in stderr and "Traceback" not in stderr
    rows = [json.loads(line) for line in trials.read_text().splitlines()]
    assert rows and all(r["kind"] in ("verify", "points") for r in rows)


def test_an_interrupt_python_ignored_is_raised_by_the_next_wait_on_a_worker():
    """A signal's exception that lands in an at-fork hook is lost; the wait loop raises it."""
    from attnbench.errors import Terminated, interrupt_on_signal, raise_pending_interrupt
    from attnbench.runtime.supervise import Child

    try:
        interrupt_on_signal(signal.SIGTERM, None)
    except Terminated:
        pass  # where Python ignores it
    child = Child([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(Terminated):
            child.watch(phase_limit_s=60)
        assert child.proc.wait(timeout=30) != 0  # the worker does not outlive the interrupt
        child.watch(phase_limit_s=60)  # raised once only
    finally:
        child.kill()
        with contextlib.suppress(KeyboardInterrupt):
            raise_pending_interrupt()  # nothing left for the tests after this one


def test_a_lost_interrupt_is_not_printed_but_any_other_ignored_error_is(capsys):
    from attnbench.errors import Terminated, _quiet_lost_interrupts

    class Dropped:
        def __del__(self):
            raise self.exc

    for exc in (Terminated(), ValueError("kept")):
        d = Dropped()
        d.exc = exc
        hook, sys.unraisablehook = sys.unraisablehook, _quiet_lost_interrupts
        try:
            del d  # Python ignores what __del__ raises and hands it to the hook
        finally:
            sys.unraisablehook = hook
    err = capsys.readouterr().err
    assert "ValueError: kept" in err and "Terminated" not in err


def _cut_short(interrupt):
    """An import that a signal's interrupt cut short: Python's import machinery raises this."""
    try:
        raise interrupt
    except KeyboardInterrupt as exc:
        raise ImportError("initialization failed") from exc


@pytest.mark.parametrize(
    "during_start_up, code",
    [
        (lambda: _raise(Terminated()), 143),
        (lambda: _raise(KeyboardInterrupt()), 130),
        (lambda: _cut_short(Terminated()), 143),
    ],
    ids=["sigterm", "ctrl-c", "sigterm cutting an import short"],
)
def test_an_interrupt_before_the_first_trial_exits_with_its_signals_code(monkeypatch, capsys, during_start_up, code):
    """typer alone would end the run with a silent exit 130 (SIGTERM's too), and an import the
    signal cut short would be a traceback."""
    import attnbench.plan.series

    monkeypatch.setattr(attnbench.plan.series, "build_plan", lambda *a, **k: during_start_up())
    assert main_in_process("bench", "--impl", "naive", "--seq-lens", "128", *CPU) == code
    err = capsys.readouterr().err
    assert err.strip() == "interrupted" and "Traceback" not in err


def test_an_error_no_interrupt_caused_is_not_taken_for_one(monkeypatch):
    import attnbench.plan.series

    def broken(*args, **kwargs):
        raise ImportError("a missing module")

    monkeypatch.setattr(attnbench.plan.series, "build_plan", broken)
    with pytest.raises(ImportError, match="a missing module"):
        main_in_process("bench", "--impl", "naive", "--seq-lens", "128", *CPU)


def _raise(exc):
    raise exc
