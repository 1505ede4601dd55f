"""Run a child process under a phase deadline and classify how it ended.

The child speaks a tiny protocol: ``phase NAME [LIMIT_S]`` lines on stdout (``announce_phase``),
so the parent knows when the timed work starts and how long a phase may take (a warm-up or a
timing budget can be longer than one call's limit); its result travels as a JSON file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from attnbench.measure.oom import is_oom_text

# Seconds a child may take to start (import torch, create a CUDA context, allocate inputs)
# before the timed work begins, and the grace on top of each phase's time limit.
STARTUP_ALLOWANCE_S = 300.0

# Phases whose length is not the trial's business: starting up, compiling kernels.
UNTIMED_PHASES = ("startup", "compile")

PHASE_PREFIX = "phase "

# Test hook: with ATTNBENCH_PAUSE_AFTER_TRIALS=N a sweep that has recorded N trials waits for
# a signal before its next one, so a test interrupts it at a known point, not a raced one.
PAUSE_AFTER_TRIALS_ENV = "ATTNBENCH_PAUSE_AFTER_TRIALS"


def phase_grace_s(limit_s: float) -> float:
    """Slack on top of a phase's limit before the parent kills the child."""
    return 2.0 + 0.1 * limit_s


def announce_phase(name: str, limit_s: float | None = None) -> None:
    """Tell the supervising parent (reading our stdout) that phase ``name`` starts now and,
    when given, that it may last ``limit_s`` (else the per-call limit applies)."""
    print(f"{PHASE_PREFIX}{name}" + (f" {limit_s:g}" if limit_s else ""), flush=True)


def pause_after_trials(recorded: int) -> None:
    """Wait for a signal (Ctrl-C raises) if the test hook asks for a pause at ``recorded`` trials."""
    if os.environ.get(PAUSE_AFTER_TRIALS_ENV) == str(recorded):
        signal.pause()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONUNBUFFERED"] = "1"
    # glibc reserves 64 MiB of address space per malloc arena; a few arenas keep the CPU
    # memory limit (an address-space limit) about real allocations.
    env.setdefault("MALLOC_ARENA_MAX", "2")
    # attnbench must be importable by the child however the parent found it
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def supervise(cmd: list[str], phase_limit_s: float, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; kill it (and its process group) when a phase runs past its limit."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(extra_env), start_new_session=True)
    state = {"phase": "startup", "since": time.monotonic(), "limit": None}
    stderr_tail: deque[str] = deque(maxlen=40)

    def read_phases():
        for line in proc.stdout:
            if line.startswith(PHASE_PREFIX):  # "phase NAME [LIMIT_S]"
                parts = line.split()
                limit = float(parts[2]) if len(parts) > 2 else None
                state.update(phase=parts[1], since=time.monotonic(), limit=limit)

    def read_stderr():
        for line in proc.stderr:
            stderr_tail.append(line.rstrip())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_phases, read_stderr)]
    for r in readers:
        r.start()
    killed = None
    try:
        while proc.poll() is None:
            own = state["limit"] or phase_limit_s
            limit = STARTUP_ALLOWANCE_S if state["phase"] in UNTIMED_PHASES else own + phase_grace_s(own)
            elapsed = time.monotonic() - state["since"]
            if elapsed > limit:
                killed = f"killed in phase {state['phase']} after {elapsed:.0f} s (limit {limit:.0f} s)"
                kill(proc)
                break
            time.sleep(0.05)
    except BaseException:  # Ctrl-C: the child must not outlive us
        kill(proc)
        raise
    proc.wait()
    for r in readers:
        r.join(timeout=5)
    if killed:
        return {"status": "time-limit", "message": killed, "times_ms": []}
    return classify_exit(proc.returncode, list(stderr_tail))


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (a torchrun agent takes its ranks with it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def classify_exit(returncode: int, stderr_tail: list[str]) -> dict[str, Any]:
    """A child that died without writing its result."""
    last = next((line for line in reversed(stderr_tail) if line.strip()), "")
    if returncode == -signal.SIGKILL:
        # we did not kill it, so the kernel did: its OOM killer
        return {"status": "oom", "message": "killed by SIGKILL, not by attnbench: the kernel's OOM killer", "times_ms": []}
    status = "oom" if is_oom_text(last) else "error"
    return {"status": status, "message": f"trial process exited with {returncode}: {last}"[:400], "times_ms": []}
