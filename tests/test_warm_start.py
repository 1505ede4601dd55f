"""Warm starts: every trial still runs in a process of its own, but that process was started
(python up, torch and attnbench imported, no CUDA context) while the previous trial ran; a
spare never outlives the sweep that started it, however the sweep ends; each trial row says
where its seconds went."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability import _zombie, wait_for
from worker_jobs import Nothing, whoami

from attnbench.runtime.supervise import PAUSE_AFTER_TRIALS_ENV
from attnbench.runtime.worker import SPARES, alive, close_spares, run_in_child

from conftest import ROOT

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def jobs_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    yield
    close_spares()


def test_each_job_runs_in_a_process_of_its_own_started_while_the_previous_job_ran(jobs_importable):
    first = run_in_child(whoami, Nothing(), 300, warm="worker_jobs:nothing")
    (spare,) = SPARES.pids()  # started while the first job ran, waiting for the next
    assert spare != first.result.pid and not alive(first.result.pid)
    second = run_in_child(whoami, Nothing(), 300, warm="worker_jobs:nothing")
    assert second.result.pid == spare
    assert SPARES.pids() and SPARES.pids() != [spare]
    for result in (first, second):
        assert set(result.phase_s) >= {"start", "exit"} and min(result.phase_s.values()) >= 0


def test_a_progress_display_hears_each_phase_of_the_running_job(jobs_importable, monkeypatch):
    """What the spinner shows in a terminal: the phases the worker announces, as they arrive,
    and nothing once the display has stopped listening."""
    from attnbench.cli import base
    from attnbench.cli.progress import _Running
    from attnbench.runtime.worker import PHASE_LISTENERS

    monkeypatch.setattr(base.console, "_force_terminal", True)

    heard = []
    PHASE_LISTENERS.append(heard.append)
    try:
        run_in_child(whoami, Nothing(), 300)
    finally:
        PHASE_LISTENERS.remove(heard.append)
    assert heard[0] == "startup" and heard[-1] == "exit"
    spinner = _Running("grow N=4K")
    spinner.phase("timing")
    (task,) = spinner._progress.tasks
    assert task.description.startswith("grow N=4K") and "timing" in task.description
    spinner.stop()
    assert spinner.phase not in PHASE_LISTENERS


def test_a_log_gets_no_spinner_and_no_blank_line_per_trial(capsys, monkeypatch):
    from attnbench.cli import base
    from attnbench.cli.progress import _Running

    monkeypatch.setattr(base.console, "_force_terminal", False)  # a log file, whatever FORCE_COLOR says
    spinner = _Running("grow N=4K")
    spinner.stop()
    assert capsys.readouterr().out == ""


def test_a_log_hears_a_long_trial_is_still_running_with_its_seconds_and_phase(capsys, monkeypatch):
    """The line a log gets every HEARTBEAT_S seconds of a trial (called here with the seconds
    given, not waited for)."""
    from attnbench.cli import base
    from attnbench.cli.progress import _Running

    monkeypatch.setattr(base.console, "_force_terminal", False)
    spinner = _Running("grow N=4K", "(a call may take up to 60 s)")
    spinner.phase("first-call")
    spinner.heartbeat(12.4)
    spinner.stop()
    assert capsys.readouterr().out.strip() == "... 12 s: grow N=4K  first call  (a call may take up to 60 s)"


def test_two_spares_ahead_are_taken_in_the_order_they_started(jobs_importable):
    """On a GPU the next two trials' processes start ahead: an import can outlast a short trial."""
    run_in_child(whoami, Nothing(), 300, warm="worker_jobs:nothing", spares=2)
    ahead = SPARES.pids()
    assert len(ahead) == 2
    second = run_in_child(whoami, Nothing(), 300, warm="worker_jobs:nothing", spares=2)
    assert second.result.pid == ahead[0] and SPARES.pids()[0] == ahead[1] and len(SPARES.pids()) == 2


def test_a_spare_imports_the_trial_machinery_without_a_cuda_context(jobs_importable):
    """What a spare does before its job (every implementation imported) creates no CUDA
    context: a second context would take GPU memory from the running trial."""
    run_in_child(whoami, Nothing(), 300, warm="attnbench.trials.trial:preload")
    result = run_in_child(whoami, Nothing(), 300, warm="attnbench.trials.trial:preload")
    assert result.result.cuda_initialized is False


SWEEP = [
    "max-seq",
    "--impl",
    "naive",
    "--device",
    "cpu",
    "--dtype",
    "fp32",
    "--heads",
    "1",
    "--head-dim",
    "8",
    "--start",
    "128",
    "--max-seq-len",
    "1024",
]


def spares_of(pid: int) -> list[int]:
    """Spare workers whose parent is ``pid``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if int(stat[1]) == pid and b"--spare" in cmd:
            found.append(int(proc.name))
    return found


def row_kinds(path: Path) -> set[str]:
    """The kinds of the complete rows written so far."""
    if not path.exists():
        return set()
    kinds = set()
    for line in path.read_text().splitlines():
        try:
            kinds.add(json.loads(line).get("kind"))
        except ValueError:  # a row still being written
            continue
    return kinds


def paused_sweep(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """A sweep waiting before its second trial (the test hook), and its spare workers' pids
    (one, or two while a finished trial's worker is still exiting on a busy machine)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), PAUSE_AFTER_TRIALS_ENV: "1"}
    out = tmp_path / "run"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "attnbench", *SWEEP, "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # a trial's row by its kind: the reference checks' rows name the command, max-seq included
    wait_for(lambda: "max-seq" in row_kinds(out / "trials.jsonl"), "a trial")
    wait_for(lambda: spares_of(sweep.pid) or sweep.poll() is not None, "the next trial's spare worker")
    return sweep, spares_of(sweep.pid)


def gone(pid: int) -> bool:
    return not alive(pid) or _zombie(pid)


@pytest.mark.slow
def test_a_spare_dies_with_a_sweep_that_is_killed(tmp_path):
    sweep, spares = paused_sweep(tmp_path)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    wait_for(lambda: all(map(gone, spares)), "the spares to die with their parent (parent-death signal)")


@pytest.mark.slow
def test_a_spare_is_killed_when_the_sweep_is_interrupted(tmp_path):
    sweep, spares = paused_sweep(tmp_path)
    sweep.send_signal(signal.SIGINT)
    _, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 130, stderr
    assert spares and all(map(gone, spares)), "the interrupted sweep left a spare worker running"


@pytest.mark.parametrize("first", [True, False])
def test_ctrl_c_while_a_worker_starts_leaves_none_running(jobs_importable, monkeypatch, first):
    """The signal lands just as a worker has started, before the code that keeps it has it
    (the job's worker, or the next job's spare): the run stops, and ending the run kills every
    worker it started, none left behind to die later."""
    from attnbench.errors import interrupt_on_signal
    from attnbench.runtime import worker

    started = []

    def spawn_then_ctrl_c(preload):
        child = spawn(preload)
        started.append(child.pid)
        if len(started) == (1 if first else 2):
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs at once, here
        return child

    spawn = worker.spawn_spare
    monkeypatch.setattr(worker, "spawn_spare", spawn_then_ctrl_c)
    before = signal.signal(signal.SIGINT, interrupt_on_signal)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_in_child(whoami, Nothing(), 300, warm="worker_jobs:nothing")
        close_spares()  # what the end of an interrupted run does
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(started) == 2 and not any(map(alive, started)), started


@pytest.mark.parametrize("reaped", [True, False])
def test_a_spare_that_died_while_it_waited_is_replaced(jobs_importable, reaped):
    """Killed from outside before its job (the OOM killer, say): the job runs in a fresh worker,
    whether the spare is already gone or still dying when the job is handed over."""
    run_in_child(whoami, Nothing(), 300, warm="worker_jobs:nothing")
    (spare,) = SPARES.spares
    os.kill(spare.pid, signal.SIGKILL)
    if reaped:
        spare.proc.wait()
    result = run_in_child(whoami, Nothing(), 300, warm="worker_jobs:nothing")
    spare = spare.pid
    assert result.result is not None and result.result.pid != spare and "start" in result.phase_s, result


@pytest.mark.parametrize("device,spares", [("cpu", 1), ("cuda", 2)])
def test_the_reference_check_starts_the_spares_its_trials_keep(monkeypatch, device, spares):
    """A trial keeps one spare process ahead on the CPU, two on a GPU (an import there can
    outlast a short trial): the check before the trials starts that many, so the second trial
    does not wait for its own interpreter."""
    from types import SimpleNamespace

    from attnbench.trials import trial
    from attnbench.trials.reference import VerifyCase

    asked = {}

    def run_in_child(job, spec, limit, **kw):
        asked.update(kw)
        return SimpleNamespace(result=SimpleNamespace(checks=[]))

    monkeypatch.setattr(trial, "run_in_child", run_in_child)
    case = VerifyCase("sdpa", {}, 1, 128, 2, 16, False, "fp32", device)
    trial.run_verify_isolated([case], warm=True)
    assert asked["spares"] == spares == (trial.GPU_SPARES if device == "cuda" else 1)
