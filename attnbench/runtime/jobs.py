"""Work handed to a process of its own: a job is a module-level function made a ``Job`` by the
``@job`` decorator, ``run(spec) -> result``, whose spec and result are dataclasses named by its
annotations. Both cross the process boundary as JSON (``results.convert.to_json``) and are read
back checked (``schema.received``: a field the two sides disagree on is named, not guessed at);
the worker finds the job by its name, ``"module:function"``.

A job every rank of a multi-process launch runs (``runtime.distributed.launch``) takes its
``Place`` as a second argument, ``run(spec, place) -> result``; the launch gives back how each
rank ended (``RankEnded``), with its result read the same way.
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
class Place:
    """Where one rank of a multi-process job runs."""

    rank: int
    world: int  # ranks in all
    device: str  # "cuda" (this rank's GPU is current) or "cpu"
    local_rank: int = 0  # its rank on its own node (its GPU's index there)


@dataclass(frozen=True)
class JobFile:
    """What a job's process reads from its job file (a worker's, or every rank's of a launch,
    and every node's of a run over several nodes): the job, its spec as the job sent it, and
    for ranks their device and how long a collective may wait."""

    job: str  # "module:function"
    spec: Any  # the job's spec as JSON: the process reads it as the job's own type
    device: str = "cpu"
    collective_timeout_s: float | None = None


@dataclass(frozen=True)
class Returned:
    """What a worker writes back: the job's result as JSON, and whether the job left it early
    (``partial``: the parent then adds how the job ended)."""

    result: Any
    partial: bool = False


@dataclass(frozen=True)
class Job(Generic[S, R]):
    name: str  # "module:function", how a worker finds it
    run: Callable[..., R]  # (spec) -> result, or (spec, place) -> result for a rank job
    spec: type[S]
    result: type[R]
    ranked: bool = False  # runs on every rank of a launch, told its Place

    def __call__(self, spec: S, *place: Place) -> R:  # in this process (a test, a job calling another)
        return self.run(spec, *place)

    def spec_json(self, spec: S) -> Any:
        return to_json(spec, nulls=True)

    def result_json(self, result: R) -> Any:
        return to_json(result, nulls=True)

    def read_spec(self, data: Any) -> S:
        return received(self.spec, data, f"the job file of {self.name}")

    def read_result(self, data: Any, sender: str | None = None) -> R:
        return received(self.result, data, sender or f"the worker of {self.name}")


def function_ref(fn: Callable | str) -> str:
    """``"module:function"`` for a module-level function (a string is taken as given)."""
    if isinstance(fn, str):
        return fn
    if fn.__module__ == "__main__" or not fn.__qualname__.isidentifier():
        raise ValueError(f"{fn.__qualname__} is not importable by a worker: define it at the top of a module")
    return f"{fn.__module__}:{fn.__qualname__}"


def job(fn: Callable[..., R]) -> Job[Any, R]:
    """``fn(spec) -> result`` (or ``fn(spec, place: Place) -> result``, a rank job) as a job;
    both types from its annotations, each a dataclass."""
    name = function_ref(fn)
    hints = typing.get_type_hints(fn)
    result = hints.pop("return", None)
    spec, *place = hints.values()
    if place not in ([], [Place]):
        raise TypeError(f"{fn.__qualname__}: a job takes its spec, and a rank job its Place after it")
    for what, tp in (("spec", spec), ("result", result)):
        if not dataclasses.is_dataclass(tp):
            raise TypeError(f"{fn.__qualname__}: a job's {what} is a dataclass, not {tp!r}")
    return Job(name, fn, spec, result, ranked=bool(place))


def resolve(ref: str) -> Any:
    """What ``"module:name"`` names (a job, or a spare worker's preload function)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def find_job(name: str, ranked: bool = False) -> Job:
    found = resolve(name)
    if not isinstance(found, Job):
        raise TypeError(f"{name} is not a job: make it one with @job")
    if found.ranked and not ranked:
        raise TypeError(f"{name} is a rank job: launch it on ranks (runtime.distributed.launch)")
    if ranked and not found.ranked:
        raise TypeError(f"{name} is not a rank job: give it a Place after its spec")
    return found


@dataclass(frozen=True)
class Ended:
    """How a child process ended, as its supervisor classified it (a phase past its limit, a
    signal, an exit), for a worker that left no result or only a partial one, or a launcher:
    status and message as a row writes them."""

    status: str
    message: str
    stopped: bool = False  # a launcher ended because another node's ranks failed or a node was lost


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


@dataclass
class RankEnded:
    """How one rank of a multi-process job ended (``distributed.launch`` gives one per rank):
    ``status`` "ok" with the job's result, or how it failed. A rank that failed wrote why and
    when (``failed_at``); one a signal ended has it (``signal``); one that left nothing has its
    launcher's account (``outcome``, or that its node was lost). A result that carries a
    status of its own (a trial past its time limit) gives the rank that status and message."""

    rank: int
    status: str
    message: str = ""
    result: Any = None  # the job's result (its JSON while it crosses a process or a node)
    failed_at: float | None = None  # time.time() of the failure: the first is the cause
    outcome: str | None = None
    signal: int | None = None

    @classmethod
    def finished(cls, rank: int, result: Any) -> RankEnded:
        """A rank whose job returned: "ok", or the status its result says."""
        status = getattr(result, "status", None) or "ok"
        message = (getattr(result, "message", None) or "") if status != "ok" else ""
        return cls(rank, status, message, result)
