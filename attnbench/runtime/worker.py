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


def run_in_child(fn: JobFunction | str, args: dict[str, Any], phase_limit_s: float) -> dict[str, Any]:
    """Run ``fn(args)`` in a fresh worker process; its result, or how the process ended."""
    with tempfile.TemporaryDirectory(prefix="attnbench-trial-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps({"function": function_ref(fn), "args": args}))
        outcome = supervise(python_module("attnbench.runtime.worker", str(job_path), str(result_path)), phase_limit_s)
        if result_path.exists():
            return json.loads(result_path.read_text())
        return outcome


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    write_json_atomic(Path(result_path), resolve(job["function"])(job["args"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
