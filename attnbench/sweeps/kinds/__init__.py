"""Sweep kinds: how a series of each kind is planned, run and summarised, by name.

A series' ``kind`` setting names its kind; the runner (``attnbench.sweeps.runner``) checks and
verifies every series, then hands each to its kind. A kind is an object with:

- ``name``: the ``kind`` setting that selects it;
- ``resolve(series, have_cuda, gpus, clip)``: plan: the series with its device resolved and
  every bad input raised as an ``AttnbenchError`` (or None and a note, where this machine's GPUs
  cannot hold it and the profile lets it be dropped);
- ``verify_cases(series)``: plan: the reference-check cases it needs;
- ``run(series, runner, index, total)``: its trials, through the runner's services
  (``runner.trial``, ``runner.append_once``, ``runner.reporter``), returning its outcome;
- ``unverified(series, runner, index, total)``: what to say when its check failed;
- ``row_kinds`` and ``result_kinds``: the row kinds its trials and its summaries are written as
  (a resumed run replays those).

Trial-based kinds subclass ``kinds.base.TrialKind`` and write trial rows of an existing row
kind (``points`` or ``max-seq``), so every reader understands them; adding one is one module
in this package that calls ``register`` (the package is imported whole when a kind is first
looked up). ``max_seq``, ``points`` and ``speedup`` (a package: its kind, runner, rank job,
strategies and rows) are the built-in ones.
"""

from __future__ import annotations

from typing import Any, Protocol

from attnbench.errors import AttnbenchError
from attnbench.registry import Registry
from attnbench.units import brief


class SweepKind(Protocol):
    name: str
    row_kinds: tuple[str, ...]
    result_kinds: tuple[str, ...]

    def resolve(self, series, have_cuda: bool, gpus: int, clip: bool) -> tuple[Any, str | None]: ...
    def verify_cases(self, series) -> list: ...
    def run(self, series, runner, index: int, total: int) -> Any: ...
    def unverified(self, series, runner, index: int, total: int) -> None: ...


# the kinds, each registered by its module under this package (``speedup`` is a package of its own)
KINDS: Registry[SweepKind] = Registry("sweep kind", __name__)


def register(kind: SweepKind) -> SweepKind:
    return KINDS.register(kind.name, kind)


def get(name: str) -> SweepKind:
    kinds = KINDS.entries()
    if name not in kinds:
        raise AttnbenchError(f"unknown kind {brief(name)}: choose from {', '.join(kinds)}")
    return kinds[name]


def trial_kinds() -> set[str]:
    """Row kinds of trials a resumed run replays by (series, length)."""
    return {k for kind in KINDS.entries().values() for k in kind.row_kinds}


def result_kinds() -> set[str]:
    return {k for kind in KINDS.entries().values() for k in kind.result_kinds}
