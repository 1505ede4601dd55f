"""The worker process: run one job (``runtime.jobs``), write its result as JSON.

    python -m attnbench.runtime.worker JOB.json RESULT.json
    python -m attnbench.runtime.worker --spare MODULE...   (then JOB.json RESULT.json on stdin)

``JOB.json`` is ``{"job": "module:function", "spec": {...}}``; the worker imports the job, reads
its spec checked, runs it and writes ``{"result": {...}}``. ``run_in_child`` is the parent side:
it writes the job file, supervises the worker and reads the result back checked (or, when the
worker died without one, the supervisor's account of why: ``jobs.Ended``).

Warm starts. Every job still runs in a process of its own, but with ``warm`` that process was
started while earlier jobs ran: a spare worker imports its modules (torch and attnbench:
seconds) and waits for its job on stdin. It touches no GPU before its job (a
second CUDA context would take memory from the running trial and move its out-of-memory
edge). While a job times its calls the spares can be held stopped (``hold_phases``), so on a
machine with few cores their imports do not share the CPU with the measurement. A spare dies
with its parent (parent-death signal), is killed on exit and on Ctrl-C (``close_spares``).

The result of a job run here carries ``phase_s``: the seconds of each phase the worker
announced, with ``start`` (waiting for python and the imports) first and ``exit`` last.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from attnbench.errors import interrupts_held
from attnbench.results.convert import to_json
from attnbench.results.schema import received
from attnbench.runtime.jobs import Job, JobFile, Ran, Returned, find_job, resolve
from attnbench.runtime.supervise import Child, announce_phase, claim_protocol, python_module

S = TypeVar("S")
R = TypeVar("R")

# Every temp dir attnbench makes is attnbench-KIND-PID-RANDOM, PID its maker's, so a later run
# can remove the dirs of makers that died without cleaning up (SIGKILL): their workers and
# ranks died with them (parent-death signal, the group keeper), so nothing else uses them.
TEMP_PREFIX = "attnbench-"

# Who else hears each phase a running job announces (a progress display), as it arrives:
# called on the thread that reads the worker's output, so a listener must be quick.
PHASE_LISTENERS: list[Callable[[str], None]] = []


def _phase_heard(hold: Callable[[str], None] | None) -> Callable[[str], None]:
    def heard(phase: str) -> None:
        if hold is not None:
            hold(phase)
        for listen in list(PHASE_LISTENERS):
            listen(phase)

    return heard


def run_in_child(
    job: Job[S, R],
    spec: S,
    phase_limit_s: float,
    memory_limit: int | None = None,
    warm: bool | str = False,
    hold_phases: tuple[str, ...] = (),
    spares: int = 1,
) -> Ran[R]:
    """Run ``job(spec)`` in a worker process of its own: its result, or how the process ended
    (``memory_limit`` is evidence for telling the OOM killer from another kill), with the
    seconds of each phase. ``warm``: take the spare worker started during an earlier job, and
    keep ``spares`` of them started for the next jobs (a ``"module:function"`` to run in them
    ahead of a job, or True: import the job's module); spares are stopped while this job is in
    one of ``hold_phases``."""
    with owned_temp_dir("trial") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        write_json_atomic(job_path, JobFile(job.name, job.spec_json(spec)))
        handed = time.monotonic()
        with interrupts_held():  # Ctrl-C now is raised by watch, which kills the child
            if warm:
                preload = warm if isinstance(warm, str) else job.name.partition(":")[0]
                child = hand(SPARES.take(preload), preload, f"{job_path}\t{result_path}")
                SPARES.start(preload, spares)  # the next jobs' processes, while this one runs
                on_phase = _phase_heard(SPARES.holder(hold_phases))
            else:
                child = Child(python_module("attnbench.runtime.worker", str(job_path), str(result_path)))
                handed, on_phase = child.started, _phase_heard(None)
        try:
            outcome = child.watch(phase_limit_s, memory_limit=memory_limit, on_phase=on_phase)
            if warm and not result_path.exists() and not started_job(child, handed):
                # the spare died as it was handed the job (killed from outside): a fresh one runs it
                child = hand(None, preload, f"{job_path}\t{result_path}")
                outcome = child.watch(phase_limit_s, memory_limit=memory_limit, on_phase=on_phase)
        finally:
            SPARES.hold(False)
        returned = (
            received(Returned, json.loads(result_path.read_text()), "the result") if result_path.exists() else None
        )
        result = job.read_result(returned.result) if returned else None
        ended = outcome if result is None or returned.partial else None
        return Ran(result, ended, phase_seconds(child, handed))


def hand(spare: Child | None, preload: str, job: str) -> Child:
    """Give ``job`` to the spare, or to a worker started now where there is none or the spare
    died before it could read it."""
    if spare is not None:
        try:
            spare.send(job)
            return spare
        except OSError:  # its stdin is gone: the spare died while it waited
            spare.kill()
    child = spawn_spare(preload)
    child.send(job)
    return child


def started_job(child: Child, handed: float) -> bool:
    """Whether the worker began the job it was handed (announced a phase of it)."""
    return any(name != "ready" and t >= handed for name, t in child.marks)


def phase_seconds(child: Child, handed: float) -> dict[str, float]:
    """Seconds of each phase from when the job was handed over: ``start`` (until the job's
    first phase: python and the imports where the process was not ready yet), each phase the
    job announced, ``exit`` (writing the result, the interpreter's exit)."""
    points = [("start", handed)]
    points += [(name, max(t, handed)) for name, t in child.marks if name != "ready"]
    points.append(("", child.ended or points[-1][1]))
    out: dict[str, float] = {}
    for (name, t), (_, t_next) in zip(points, points[1:]):
        out[name] = out.get(name, 0.0) + max(0.0, t_next - t)
    return {k: round(v, 3) for k, v in out.items()}


# ---------------------------------------------------------------------------------------
# Spare workers
# ---------------------------------------------------------------------------------------


def spawn_spare(preload: str) -> Child:
    """A worker that runs or imports ``preload`` (torch with it) and waits for its job."""
    return Child(python_module("attnbench.runtime.worker", "--spare", preload), stdin=True)


class Spares:
    """Spare workers started while the current job runs, taken in order by the next jobs:
    ``depth`` of them, so each has that many jobs' time to import before it is needed."""

    def __init__(self) -> None:
        self.spares: list[Child] = []
        self.preload = ""
        self.held = False

    def start(self, preload: str, depth: int = 1) -> None:
        """Keep ``depth`` spares for ``preload`` (spares of another preload are killed)."""
        if preload != self.preload:
            self.close()
            self.preload = preload
        while len(self.spares) < depth:
            with interrupts_held():  # recorded before Ctrl-C can end the run: close() kills it
                self.spares.append(spawn_spare(preload))
            if self.held:  # a spare started during a held phase waits too
                self._signal(self.spares[-1], signal.SIGSTOP)

    def take(self, preload: str) -> Child | None:
        """The oldest live spare started for ``preload`` (continued if it was stopped)."""
        while self.spares and preload == self.preload:
            spare = self.spares.pop(0)
            if self.held:
                self._signal(spare, signal.SIGCONT)
            if spare.proc.poll() is None:
                return spare
            spare.kill()
        return None

    def holder(self, phases: tuple[str, ...]) -> Callable[[str], None]:
        return lambda phase: self.hold(phase in phases)

    def hold(self, stopped: bool) -> None:
        """Stop (SIGSTOP) or continue the spares; a stopped process still dies of SIGKILL."""
        if stopped == self.held:
            return
        self.held = stopped
        for spare in self.spares:
            self._signal(spare, signal.SIGSTOP if stopped else signal.SIGCONT)

    def _signal(self, spare: Child, sig: int) -> None:
        if spare.proc.poll() is None:
            try:
                os.kill(spare.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for spare in self.spares:
            spare.kill()
        self.spares, self.held = [], False

    def pids(self) -> list[int]:
        return [s.pid for s in self.spares if s.proc.poll() is None]


SPARES = Spares()
atexit.register(SPARES.close)


def close_spares() -> None:
    """Kill the spare workers (the end of a run, Ctrl-C)."""
    SPARES.close()


def owned_temp_dir(kind: str) -> tempfile.TemporaryDirectory:
    """A temp dir (a context manager) named for this process, the orphans of dead makers
    removed first: every temp dir attnbench makes is made here."""
    remove_orphaned_temp_dirs()
    return tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{kind}-{os.getpid()}-")


def remove_orphaned_temp_dirs(root: Path | None = None) -> list[Path]:
    """Temp dirs of attnbench processes that died without cleaning up (SIGKILL): their
    workers died with them, so nothing else uses the dirs."""
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*-*"):
        pid = d.name[len(TEMP_PREFIX) :].split("-")[1]  # KIND-PID-RANDOM
        if not pid.isdigit() or alive(int(pid)) or d.is_symlink() or d.stat().st_uid != os.getuid():
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` (a typed message, or JSON values) through an unpredictable temp name in the same
    directory, never through a link."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(to_json(data, nulls=True), default=str))
    os.replace(tmp, path)


# The job running in this process and where it writes its result (``leave_partial`` writes
# there early, through the job, as the job's own result is written).
_RUNNING: list[tuple[Job, Path]] = []


def leave_partial(result: Any) -> None:
    """Write ``result`` (the job's typed result) now, marked partial: if this job is stopped
    later (a phase past its limit), the parent still reads it. The job's own result replaces it
    when it returns."""
    if _RUNNING:
        job, path = _RUNNING[0]
        write_json_atomic(path, Returned(job.result_json(result), partial=True))


def main(job_path: str, result_path: str) -> None:
    sent = received(JobFile, json.loads(Path(job_path).read_text()), "the job file")
    job = find_job(sent.job)
    spec = job.read_spec(sent.spec)
    # run as ``python -m``, this file is __main__: the jobs import it again by its name, and read it there
    importlib.import_module("attnbench.runtime.worker")._RUNNING[:] = [(job, Path(result_path))]
    announce_phase("ready")
    result = job.run(spec)
    announce_phase("exit")
    write_json_atomic(Path(result_path), Returned(job.result_json(result)))
    # the result is on disk: leave without the interpreter's teardown of torch's modules (seconds)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spare(preload: str) -> None:
    """Run ``preload`` (``"module:function"``, or a module to import) now, then wait for one
    job (``JOB.json<TAB>RESULT.json``) on stdin."""
    if ":" in preload:
        resolve(preload)()
    else:
        importlib.import_module(preload)
    announce_phase("ready")
    line = sys.stdin.readline().rstrip("\n")
    if not line:  # the parent closed the pipe: no job is coming
        return
    main(*line.split("\t"))


if __name__ == "__main__":
    claim_protocol()  # before any job's code: what it prints is its output, not the protocol
    if sys.argv[1] == "--spare":
        spare(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
