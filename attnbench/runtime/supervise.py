"""Run a child process under a phase deadline and classify how it ended.

The child speaks a tiny protocol: ``phase NAME [LIMIT_S]`` lines on the stdout it started with
(``announce_phase``), so the parent knows when the timed work starts and how long a phase may
take (a warm-up or a timing budget can be longer than one call's limit); its result travels as
a JSON file. A child that runs outside code first keeps that stdout for the protocol alone
(``claim_protocol``): what the code prints goes to its stderr, kept apart as its output.

A child runs in a process group of its own, ended with the child (a helper process its code
started goes with it) and with this process, even when this one is killed with SIGKILL: the
group keeper (``runtime.keeper``) holds every group until it is ended.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnbench.errors import raise_pending_interrupt
from attnbench.measure.oom import classify_text
from attnbench.runtime.agent import die_with_parent
from attnbench.runtime.jobs import Ended
from attnbench.units import clip_text

# Seconds a child may take to start (import torch, create a CUDA context, allocate inputs)
# before the timed work begins, and the grace on top of each phase's time limit.
STARTUP_ALLOWANCE_S = 300.0

# Phases whose length is not the trial's business: starting up (a spare worker's wait for its
# job included), building the implementation and its device, inputs, compiling kernels, the
# CPU's count of tensor bytes (one extra call), the FLOP accounting after the timed calls, and
# the float64 reference a reference check compares with.
UNTIMED_PHASES = ("startup", "ready", "setup", "device", "inputs", "compile", "tensor-peak", "accounting", "reference")
# Phases of one call: killed at their limit exactly, since a call past it is a time-limit
# whether it ends or not (the measurement core announces each one's limit).
CALL_PHASES = ("first-call", "warm-call")

PHASE_PREFIX = "phase "
# A protocol line exactly; anything else on the channel is ignored, never parsed into a phase.
PHASE_LINE = re.compile(r"phase ([a-z][a-z0-9-]*)(?: ([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?))?")
# How much of each line of a child's output is kept for its error message.
OUTPUT_LINE_CHARS = 2000

# Test hook: with ATTNBENCH_PAUSE_AFTER_TRIALS=N a sweep that has recorded N trials waits for
# a signal before its next one, so a test interrupts it at a known point, not a raced one.
PAUSE_AFTER_TRIALS_ENV = "ATTNBENCH_PAUSE_AFTER_TRIALS"


def phase_grace_s(limit_s: float) -> float:
    """Slack on top of a budgeted phase's limit before the parent kills the child: a loop of
    calls stops at its budget and its last call may run the per-call limit past it."""
    return 2.0 + 0.1 * limit_s


# The stream phase lines go to: the stdout this process started with, once claimed.
_protocol = None


def claim_protocol() -> None:
    """In a child, before it imports or runs anything else: keep the stdout the parent reads
    for phase lines alone, and send descriptor 1 (what any code prints) to stderr, where the
    parent keeps it as the child's output."""
    global _protocol
    sys.stdout.flush()
    _protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)


def announce_phase(name: str, limit_s: float | None = None) -> None:
    """Tell the supervising parent that phase ``name`` starts now and, when given, that it may
    last ``limit_s`` (else the per-call limit applies)."""
    stream = _protocol or sys.stdout
    stream.write(f"{PHASE_PREFIX}{name}" + (f" {limit_s:g}" if limit_s else "") + "\n")
    stream.flush()


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


class GroupKeeper:
    """This process's side of ``runtime.keeper``: started with the first child, told of every
    process group started and ended, so none outlives this process, however it ends."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.groups: set[int] = set()

    def add(self, pgid: int) -> None:
        self.groups.add(pgid)
        self._send(f"+{pgid}")

    def remove(self, pgid: int) -> None:
        self.groups.discard(pgid)
        self._send(f"-{pgid}")

    def _send(self, line: str) -> None:
        try:
            if self.proc is None or self.proc.poll() is not None:  # (again) with every group held now
                self.proc = subprocess.Popen(
                    python_module("attnbench.runtime.keeper"),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=child_env(),
                    start_new_session=True,
                )
                line = "\n".join(f"+{g}" for g in self.groups) or line
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except OSError:  # no keeper: a child still dies with this process (parent-death signal)
            pass


KEEPER = GroupKeeper()


def supervise(
    cmd: list[str], phase_limit_s: float, extra_env: dict[str, str] | None = None, memory_limit: int | None = None
) -> Ended:
    """Run ``cmd``; kill it (and its process group) when a phase runs past its limit. The
    child dies with this process (parent-death signal), and its exit is classified by
    evidence: the cgroup's OOM-kill counter and its resident memory against the limit."""
    return Child(cmd, extra_env).watch(phase_limit_s, memory_limit)


class Child:
    """A child process whose ``phase`` lines are read (and timed) from the moment it starts,
    so it can be started ahead of its work and watched from when the work is handed to it."""

    def __init__(self, cmd: list[str], extra_env: dict[str, str] | None = None, stdin: bool = False) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(extra_env),
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        KEEPER.add(self.proc.pid)  # its group: the child and whatever it starts
        self.state = {"phase": "startup", "since": self.started, "limit": None}
        self.ended: float | None = None  # when it exited
        self.on_phase: Callable[[str], None] | None = None  # hears each phase as its line arrives
        self.marks: list[tuple[str, float]] = []  # (phase, when it began), in order
        self.stderr_tail: deque[str] = deque(maxlen=40)
        self.ready = threading.Event()  # the child said "phase ready": started, imports done
        self.readers = [threading.Thread(target=f, daemon=True) for f in (self._read_phases, self._read_stderr)]
        for r in self.readers:
            r.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_phases(self) -> None:
        for line in self.proc.stdout:
            match = PHASE_LINE.fullmatch(line.strip())  # "phase NAME [LIMIT_S]"; anything else is not ours
            if match is None:
                continue
            name, limit = match.group(1), float(match.group(2)) if match.group(2) else None
            now = time.monotonic()
            self.marks.append((name, now))
            self.state.update(phase=name, since=now, limit=limit)
            if self.on_phase is not None:  # at once, not at the next poll: timed calls follow
                self.on_phase(name)
            if name == "ready":
                self.ready.set()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:  # read to the end, however much: a full pipe would stall the child
            self.stderr_tail.append(line.rstrip()[:OUTPUT_LINE_CHARS])

    def send(self, line: str) -> None:
        """Hand the child its work (a spare worker waits for one line on stdin)."""
        self.state.update(phase="startup", since=time.monotonic(), limit=None)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def watch(
        self, phase_limit_s: float, memory_limit: int | None = None, on_phase: Callable[[str], None] | None = None
    ) -> Ended:
        """Wait for the child, killing it when a phase runs past its limit; ``on_phase`` hears
        each phase as its line arrives. How it ended, which says why where it left no result."""
        oom_kills_before = cgroup_oom_kills()
        killed, rss_peak = None, 0
        if on_phase is not None:
            self.on_phase = on_phase
            on_phase(self.state["phase"])
        try:
            raise_pending_interrupt()  # one held while the child started: it may end before a poll
            while self.proc.poll() is None:
                raise_pending_interrupt()
                phase = self.state["phase"]
                limit = _phase_deadline(phase, self.state["limit"] or phase_limit_s)
                rss_peak = max(rss_peak, rss_of(self.proc.pid))
                elapsed = time.monotonic() - self.state["since"]
                if elapsed > limit:
                    killed = _killed_message(phase, elapsed, limit)
                    self.kill()
                    break
                time.sleep(0.05)
        except BaseException:  # Ctrl-C: the child must not outlive us
            self.kill()
            raise
        self.proc.wait()
        self.ended = time.monotonic()
        end_group(self.proc)  # what the child started ends with it
        for r in self.readers:
            r.join(timeout=5)
        if killed:
            return Ended("time-limit", killed)
        evidence = {
            "oom_kills": (oom_kills_before, cgroup_oom_kills()),
            "rss_peak": rss_peak,
            "memory_limit": memory_limit,
        }
        return classify_exit(self.proc.returncode, list(self.stderr_tail), evidence)

    def kill(self) -> None:
        kill(self.proc)


def _phase_deadline(phase: str, own_s: float) -> float:
    """Seconds phase ``phase`` may run before the child is killed."""
    if phase in UNTIMED_PHASES:
        return STARTUP_ALLOWANCE_S
    if phase in CALL_PHASES:
        return own_s
    return own_s + phase_grace_s(own_s)


def _killed_message(phase: str, elapsed: float, limit: float) -> str:
    if phase in CALL_PHASES:
        return f"a call ran past the {limit:g} s limit: killed at {elapsed:.1f} s ({phase})"
    return f"killed in phase {phase} after {elapsed:.0f} s (limit {limit:.0f} s)"


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (a torchrun agent takes its ranks with it)."""
    end_group(proc)
    proc.wait()


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process left in the child's group (its group id is its pid: a new
    session), and tell the keeper the group is ended."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    KEEPER.remove(proc.pid)


def classify_exit(
    returncode: int, stderr_tail: list[str], evidence: dict[str, Any] | None = None, what: str = "trial process"
) -> Ended:
    """A child (``what``) that died without writing its result. A signal we did not send is
    the kernel's OOM killer only with evidence: the cgroup's oom_kill counter rose, or the
    child's resident memory reached its limit; any other signal is "killed"."""
    evidence = evidence or {}
    last = next((line for line in reversed(stderr_tail) if line.strip()), "")
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        before, after = evidence.get("oom_kills") or (None, None)
        limit, rss = evidence.get("memory_limit"), evidence.get("rss_peak") or 0
        if returncode == -signal.SIGKILL and before is not None and after is not None and after > before:
            why = f"the cgroup's oom_kill count rose from {before} to {after}"
        elif returncode == -signal.SIGKILL and limit and rss >= 0.9 * limit:
            why = f"its resident memory reached {rss / 2**20:,.0f} MiB of the {limit / 2**20:,.0f} MiB limit"
        else:
            return Ended("killed", f"{what} killed by {name}, not by attnbench (no sign of the OOM killer)")
        return Ended("host-oom", f"{what} killed by {name}: the kernel's OOM killer ({why})")
    if returncode == 0:  # exited as if it had finished, without a result: code that ends its process
        return Ended("error", clip_text(f"{what} exited with 0 before writing its result: {last}", 400))
    return Ended(classify_text(last), clip_text(f"{what} exited with {returncode}: {last}", 400))


def cgroup_oom_kills() -> int | None:
    """The OOM-kill counter of this process's memory cgroup (v2, or v1's oom_control), or None."""
    try:
        rel = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::") or ":memory:" in line
        )
    except (OSError, StopIteration):
        rel = "/"
    for path in (
        Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.events",
        Path("/sys/fs/cgroup/memory.events"),
        Path("/sys/fs/cgroup/memory") / rel.lstrip("/") / "memory.oom_control",
        Path("/sys/fs/cgroup/memory/memory.oom_control"),
    ):
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def rss_of(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
