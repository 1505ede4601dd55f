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
that calls ``register``. ``max_seq``, ``points`` and ``speedup`` are the built-in ones.
"""

from __future__ import annotations

from typing import Any, Protocol

from attnbench.errors import AttnbenchError
from attnbench.units import brief


class SweepKind(Protocol):
    name: str
    row_kinds: tuple[str, ...]
    result_kinds: tuple[str, ...]

    def resolve(self, series, have_cuda: bool, gpus: int, clip: bool) -> tuple[Any, str | None]: ...
    def verify_cases(self, series) -> list: ...
    def run(self, series, runner, index: int, total: int) -> Any: ...
    def unverified(self, series, runner, index: int, total: int) -> None: ...


KINDS: dict[str, SweepKind] = {}


def register(kind: SweepKind) -> SweepKind:
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"sweep kind {kind.name!r} registered twice")
    KINDS[kind.name] = kind
    return kind


def get(name: str) -> SweepKind:
    _load()
    if name not in KINDS:
        raise AttnbenchError(f"unknown kind {brief(name)}: choose from {', '.join(KINDS)}")
    return KINDS[name]


def trial_kinds() -> set[str]:
    """Row kinds of trials a resumed run replays by (series, length)."""
    _load()
    return {k for kind in KINDS.values() for k in kind.row_kinds}


def result_kinds() -> set[str]:
    _load()
    return {k for kind in KINDS.values() for k in kind.result_kinds}


def _load() -> None:
    """The built-in kinds register themselves when imported."""
    from attnbench.sweeps.kinds import max_seq, points  # noqa: F401
    from attnbench.sweeps.kinds.speedup import kind as speedup  # noqa: F401
