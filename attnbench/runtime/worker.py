"""The worker process: run one job function, write its result as JSON.

    python -m attnbench.runtime.worker JOB.json RESULT.json

``JOB.json`` is ``{"function": "module:function", "args": {...}}``; the worker imports the
module and calls ``function(args)``, which returns a JSON-able dict. ``run_in_child`` is the
parent side: it writes the job file, supervises the worker and reads the result (or, when
the worker died without one, the supervisor's account of why).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnbench.runtime.supervise import python_module, supervise

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
    fn: JobFunction | str, args: dict[str, Any], phase_limit_s: float, memory_limit: int | None = None
) -> dict[str, Any]:
    """Run ``fn(args)`` in a fresh worker process; its result, or how the process ended
    (``memory_limit`` is evidence for telling the OOM killer from another kill)."""
    remove_orphaned_temp_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps({"function": function_ref(fn), "args": args}))
        outcome = supervise(
            python_module("attnbench.runtime.worker", str(job_path), str(result_path)),
            phase_limit_s,
            memory_limit=memory_limit,
        )
        if result_path.exists():
            return json.loads(result_path.read_text())
        return outcome


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
    write_json_atomic(Path(result_path), resolve(job["function"])(job["args"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
