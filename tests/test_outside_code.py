"""Outside code (`--impl pkg.module:factory`) runs only in supervised worker processes: never in
attnbench's own, under a time limit from its import on, with what it prints kept apart from the
workers' protocol, its exit reported as what happened, and every process it starts ended with
its worker and with attnbench, even a SIGKILLed one.

The plugin below is a user's module on PYTHONPATH; each factory misbehaves one way. Every test
runs the real command in a fresh process, as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

PLUGIN = """
import os, subprocess, sys, time
import torch
import torch.nn.functional as F

TRIAL_LENGTH = 1024  # the trials' length; reference checks run at 128 and 256


def record(what):
    with open(os.environ["PLUGIN_PIDS"], "a") as f:
        f.write(f"{what} {os.getpid()}\\n")


record("import")


class Dense(torch.nn.Module):
    def forward(self, q, k, v, is_causal=False):
        record("forward")
        if q.shape[1] == TRIAL_LENGTH:
            self.at_trial_length()
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=is_causal)
        return out.transpose(1, 2)

    def at_trial_length(self):
        pass


def dense():
    record("factory")
    return Dense()


def window(b, h, q_idx, kv_idx):  # a mask_mod for flex (--param mask=plug:window): code a parameter names
    return (q_idx - kv_idx).abs() <= 16


def hangs():
    time.sleep(3600)


def exits():
    sys.exit(3)


def exits_quietly():
    os._exit(0)


class Chatty(Dense):
    def forward(self, q, k, v, is_causal=False):
        print("phase timing 0.001")  # what the protocol looks like, and what it must not be read as
        print("phase bogus not-a-number")
        print("x" * 200_000)  # more than a pipe holds
        return super().forward(q, k, v, is_causal)


def chatty():
    return Chatty()


class StartsHelper(Dense):
    def at_trial_length(self):
        helper = subprocess.Popen(["sleep", "600"])
        with open(os.environ["HELPER_PID_FILE"], "w") as f:
            f.write(str(helper.pid))
        if os.environ.get("THEN_WAIT"):
            time.sleep(3600)


def starts_helper():
    return StartsHelper()


class ExitsInTrial(Dense):
    def at_trial_length(self):
        sys.exit(3)


def exits_in_trial():
    return ExitsInTrial()


class HangsInReference(Dense):
    def forward(self, q, k, v, is_causal=False):
        time.sleep(3600)


def hangs_in_reference():
    return HangsInReference()
"""

TINY = ["--device", "cpu", "--dtype", "fp32", "--heads", "2", "--head-dim", "16"]


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "plug.py").write_text(PLUGIN)
    return tmp_path


def start(plugin: Path, *args, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "attnbench", *map(str, args)],
        env={
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{plugin}",
            "PLUGIN_PIDS": str(plugin / "pids"),
            "HELPER_PID_FILE": str(plugin / "helper.pid"),
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(plugin: Path, *args, **env) -> tuple[subprocess.Popen, str, str]:
    proc = start(plugin, *args, **env)
    out, err = proc.communicate(timeout=600)  # a safety net; the limits under test are seconds
    return proc, out, err


def one_line_exit_2(proc, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(w in lines[0] for w in words) and "Traceback" not in err, err


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for its reaper (it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def wait_gone(pid: int, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return gone(pid)


def trial_rows(out: Path) -> list[dict]:
    rows = map(json.loads, (out / "trials.jsonl").read_text().splitlines())
    return [r for r in rows if r["kind"] == "points"]


@pytest.mark.parametrize(
    "args, ran",
    [
        (["bench", "--impl", "plug:dense", "--seq-lens", "1024", *TINY], {"import", "factory", "forward"}),
        (["verify", "--impl", "plug:dense", "--device", "cpu", "--dtype", "fp32"], {"import", "factory", "forward"}),
        (["bench", "--impl", "flex", "--param", "mask=plug:window", "--seq-lens", "1024", *TINY], {"import"}),
    ],
)
def test_outside_code_never_runs_in_attnbench_s_own_process(plugin, tmp_path, args, ran):
    proc, out, err = run(plugin, *args, *(["--out", tmp_path / "run"] if args[0] == "bench" else []))
    assert proc.returncode == 0, err
    where = [line.split() for line in (plugin / "pids").read_text().splitlines()]
    assert {what for what, _ in where} == ran  # it ran, somewhere
    assert str(proc.pid) not in {pid for _, pid in where}, (proc.pid, where)


def test_a_factory_that_hangs_is_stopped_at_its_time_limit(plugin, tmp_path):
    proc, _, err = run(plugin, "bench", "--impl", "plug:hangs", "--seq-lens", "1024", *TINY, "--max-trial-seconds", 1)
    one_line_exit_2(proc, err, "plug:hangs", "--max-trial-seconds")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("factory", ["exits", "exits_quietly"])
def test_a_factory_that_ends_its_process_is_one_line(plugin, tmp_path, factory):
    out = tmp_path / "run"
    proc, _, err = run(plugin, "bench", "--impl", f"plug:{factory}", "--seq-lens", "1024", *TINY, "--out", out)
    one_line_exit_2(proc, err, f"plug:{factory}", "ended the worker process")
    assert not out.exists()


def test_an_exit_in_a_trial_is_the_trial_s_outcome(plugin, tmp_path):
    out = tmp_path / "run"
    proc, _, err = run(plugin, "bench", "--impl", "plug:exits_in_trial", "--seq-lens", "256,1024", *TINY, "--out", out)
    assert proc.returncode == 0, err
    status = {r["seq_len"]: (r["status"], r["message"]) for r in trial_rows(out)}
    assert status[256][0] == "ok" and status[1024][0] == "error" and "exited with 3" in status[1024][1], status


def test_what_outside_code_prints_is_never_read_as_the_protocol(plugin, tmp_path):
    out = tmp_path / "run"
    args = ["bench", "--impl", "plug:chatty", "--seq-lens", "1024", *TINY, "--max-trial-seconds", 60]
    proc, _, err = run(plugin, *args, "--out", out)
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert [r["status"] for r in trial_rows(out)] == ["ok"]


def test_a_hanging_forward_in_the_reference_check_is_stopped(plugin, tmp_path):
    out = tmp_path / "run"
    args = ["bench", "--impl", "plug:hangs_in_reference", "--seq-lens", "1024", *TINY, "--max-trial-seconds", 1]
    proc, _, err = run(plugin, *args, "--out", out)
    one_line_exit_2(proc, err, "reference check", "time-limit")
    assert not out.exists()


def test_in_process_trials_of_outside_code_are_refused(plugin, tmp_path):
    proc, _, err = run(plugin, "bench", "--impl", "plug:dense", "--seq-lens", "1024", *TINY, "--in-process")
    one_line_exit_2(proc, err, "plug:dense", "--in-process")


def test_a_process_outside_code_starts_ends_with_its_trial(plugin, tmp_path):
    out = tmp_path / "run"
    proc, _, err = run(plugin, "bench", "--impl", "plug:starts_helper", "--seq-lens", "1024", *TINY, "--out", out)
    assert proc.returncode == 0, err
    helper = int((plugin / "helper.pid").read_text())
    try:
        assert gone(helper)  # ended with its trial's process group, before the run returned
    finally:
        _kill(helper)


def test_a_process_outside_code_starts_ends_with_a_sigkilled_attnbench(plugin, tmp_path):
    proc = start(plugin, "bench", "--impl", "plug:starts_helper", "--seq-lens", "1024", *TINY, THEN_WAIT="1")
    pid_file = plugin / "helper.pid"
    try:
        while not pid_file.exists() or not pid_file.read_text():  # the trial has started its helper
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        helper = int(pid_file.read_text())
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert wait_gone(helper)  # the keeper ended its group
    finally:
        proc.kill()
        if pid_file.exists():
            _kill(int(pid_file.read_text()))


def _kill(pid: int) -> None:
    """A helper this test made the plugin start, ended whatever attnbench did."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
