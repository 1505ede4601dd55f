"""Work handed to a process of its own: a job is a module-level function made a ``Job`` by the
``@job`` decorator, ``run(spec) -> result``, whose spec and result are dataclasses named by its
annotations. Both cross the process boundary as JSON (``results.convert.to_json``) and are read
back checked (``schema.received``: a field the two sides disagree on is named, not guessed at);
the worker finds the job by its name, ``"module:function"``.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from attnbench.results.convert import to_json
from attnbench.results.schema import received

S = TypeVar("S")
R = TypeVar("R")


@dataclass(frozen=True)
class Job(Generic[S, R]):
    name: str  # "module:function", how a worker finds it
    run: Callable[[S], R]
    spec: type[S]
    result: type[R]

    def __call__(self, spec: S) -> R:  # in this process (a test, a job calling another)
        return self.run(spec)

    def spec_json(self, spec: S) -> Any:
        return to_json(spec, nulls=True)

    def result_json(self, result: R) -> Any:
        return to_json(result, nulls=True)

    def read_spec(self, data: Any) -> S:
        return received(self.spec, data, f"the job file of {self.name}")

    def read_result(self, data: Any) -> R:
        return received(self.result, data, f"the worker of {self.name}")


def function_ref(fn: Callable | str) -> str:
    """``"module:function"`` for a module-level function (a string is taken as given)."""
    if isinstance(fn, str):
        return fn
    if fn.__module__ == "__main__" or not fn.__qualname__.isidentifier():
        raise ValueError(f"{fn.__qualname__} is not importable by a worker: define it at the top of a module")
    return f"{fn.__module__}:{fn.__qualname__}"


def job(fn: Callable[[S], R]) -> Job[S, R]:
    """``fn(spec) -> result`` as a job; both types from its annotations, each a dataclass."""
    name = function_ref(fn)
    hints = typing.get_type_hints(fn)
    result = hints.pop("return", None)
    (spec,) = hints.values()
    for what, tp in (("spec", spec), ("result", result)):
        if not dataclasses.is_dataclass(tp):
            raise TypeError(f"{fn.__qualname__}: a job's {what} is a dataclass, not {tp!r}")
    return Job(name, fn, spec, result)


def resolve(ref: str) -> Any:
    """What ``"module:name"`` names (a job, or a spare worker's preload function)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def find_job(name: str) -> Job:
    found = resolve(name)
    if not isinstance(found, Job):
        raise TypeError(f"{name} is not a job: make it one with @job")
    return found


@dataclass(frozen=True)
class Ended:
    """How a worker process ended without its result, or after the partial result it left
    (a phase past its limit, a signal, an exit): status and message as a row writes them."""

    status: str
    message: str


@dataclass
class Ran(Generic[R]):
    """A job run in a worker: its result (None where the process ended first), how the process
    ended where it did not finish (with a partial result: after leaving it), and the seconds
    of each phase it announced."""

    result: R | None
    ended: Ended | None
    phase_s: dict[str, float]

    @property
    def partial(self) -> bool:
        return self.result is not None and self.ended is not None
