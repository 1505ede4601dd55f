"""The worker process: run one job function, write its result as JSON.

    python -m attnbench.runtime.worker JOB.json RESULT.json
    python -m attnbench.runtime.worker --spare MODULE...   (then JOB.json RESULT.json on stdin)

``JOB.json`` is ``{"function": "module:function", "args": {...}}``; the worker imports the
module and calls ``function(args)``, which returns a JSON-able dict. ``run_in_child`` is the
parent side: it writes the job file, supervises the worker and reads the result (or, when
the worker died without one, the supervisor's account of why).

Warm starts. Every job still runs in a process of its own, but with ``warm=True`` that
process was started while the previous job ran: a spare worker imports its modules (torch and
attnbench: seconds) and waits for its job on stdin. It touches no GPU before its job (a
second CUDA context would take memory from the running trial and move its out-of-memory
edge). While a job times its calls the spare can be held stopped (``hold_phases``), so on a
machine with few cores its imports do not share the CPU with the measurement. A spare dies
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
from typing import Any

from attnbench.runtime.supervise import Child, announce_phase, python_module

JobFunction = Callable[[dict[str, Any]], dict[str, Any]]


def function_ref(fn: Callable | str) -> str:
    """``"module:function"`` for a module-level function (a string is taken as given)."""
    if isinstance(fn, str):
        return fn
    if fn.__module__ == "__main__" or not fn.__qualname__.isidentifier():
        raise ValueError(f"{fn.__qualname__} is not importable by a worker: define it at the top of a module")
    return f"{fn.__module__}:{fn.__qualname__}"


def resolve(ref: str) -> Callable:
    """The function that ``"module:function"`` names."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


# A job's temp dir names its parent's pid, so a later run can remove the dirs of parents
# that died without cleaning up (their workers died with them: parent-death signal).
TEMP_PREFIX = "attnbench-trial-"


def run_in_child(
    fn: JobFunction | str,
    args: dict[str, Any],
    phase_limit_s: float,
    memory_limit: int | None = None,
    warm: bool | str = False,
    hold_phases: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run ``fn(args)`` in a worker process of its own; its result (with ``phase_s``), or how
    the process ended (``memory_limit`` is evidence for telling the OOM killer from another
    kill). ``warm``: take the spare worker started during the previous job, and start the
    next one now (a ``"module:function"`` to run in it ahead of the job, or True: import
    the job's module); the spare is stopped while this job is in one of ``hold_phases``."""
    remove_orphaned_temp_dirs()
    ref = function_ref(fn)
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps({"function": ref, "args": args}))
        handed = time.monotonic()
        if warm:
            preload = warm if isinstance(warm, str) else ref.partition(":")[0]
            child = SPARES.take(preload) or spawn_spare(preload)
            child.send(f"{job_path}\t{result_path}")
            SPARES.start(preload)  # the next job's process, while this one runs
            on_phase = SPARES.holder(hold_phases)
        else:
            child = Child(python_module("attnbench.runtime.worker", str(job_path), str(result_path)))
            handed, on_phase = child.started, None
        try:
            outcome = child.watch(phase_limit_s, memory_limit=memory_limit, on_phase=on_phase)
        finally:
            SPARES.hold(False)
        result = json.loads(result_path.read_text()) if result_path.exists() else outcome
        result["phase_s"] = phase_seconds(child, handed)
        return result


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
    """At most one spare worker, started while the current job runs and taken by the next."""

    def __init__(self) -> None:
        self.spare: Child | None = None
        self.module = ""
        self.held = False

    def start(self, module: str) -> None:
        self.close()
        self.spare, self.module = spawn_spare(module), module

    def take(self, module: str) -> Child | None:
        """The spare, if it was started for ``module`` and is still alive."""
        spare, self.spare = self.spare, None
        self.hold(False, spare)
        if spare is not None and (spare.proc.poll() is not None or self.module != module):
            spare.kill()
            spare = None
        return spare

    def holder(self, phases: tuple[str, ...]) -> Callable[[str], None]:
        return lambda phase: self.hold(phase in phases)

    def hold(self, stopped: bool, spare: Child | None = None) -> None:
        """Stop (SIGSTOP) or continue the spare; a stopped process still dies of SIGKILL."""
        spare = spare or self.spare
        if spare is None or spare.proc.poll() is not None or stopped == self.held:
            return
        try:
            os.kill(spare.pid, signal.SIGSTOP if stopped else signal.SIGCONT)
            self.held = stopped
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.spare is not None:
            self.spare.kill()
            self.spare = None
        self.held = False

    def pids(self) -> list[int]:
        return [self.spare.pid] if self.spare is not None and self.spare.proc.poll() is None else []


SPARES = Spares()
atexit.register(SPARES.close)


def close_spares() -> None:
    """Kill the spare worker (the end of a run, Ctrl-C)."""
    SPARES.close()


def remove_orphaned_temp_dirs(root: Path | None = None) -> list[Path]:
    """Temp dirs of attnbench parents that died without cleaning up (SIGKILL): their workers
    died with them, so nothing else uses the dirs."""
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = d.name[len(TEMP_PREFIX) :].split("-", 1)[0]
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


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Through an unpredictable temp name in the same directory, never through a link."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, default=str))
    os.replace(tmp, path)


def main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    fn = resolve(job["function"])
    announce_phase("ready")
    result = fn(job["args"])
    announce_phase("exit")
    write_json_atomic(Path(result_path), result)
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
    if sys.argv[1] == "--spare":
        spare(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
