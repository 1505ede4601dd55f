"""Results for notebooks and scripts: result directories as typed rows or one flat DataFrame.

The rows are the ones ``attnbench report`` reads: every valid row under the given paths,
a series measured by several commits split into one series per commit. Lines a reader
skips (torn, not JSON, not a valid row) are reported as warnings, FILE:LINE and why.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.errors import AttnbenchError
from attnbench.results import load_rows, result_files
from attnbench.results.schema import Row

if TYPE_CHECKING:
    import pandas as pd


def load(*paths: str | Path | Iterable[str | Path]) -> list[Row]:
    """Every row under the given results directories or ``trials.jsonl`` files, typed by kind
    (``Trial``, ``MaxSeqResult``, ``Verify``, ``Speedup``), in file order, each with ``source``
    naming its FILE:LINE."""
    from attnbench.results.series import separate_code_versions

    roots = _paths(paths)
    if not any(result_files(p) for p in roots):  # result_files names a path that does not exist
        raise AttnbenchError(f"no trials.jsonl under {', '.join(map(str, roots))}: give a results directory")
    rows, problems = load_rows(roots)
    for line in problems:
        warnings.warn(line, stacklevel=2)
    return separate_code_versions(rows)


def load_frame(*paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """The rows of ``load`` as one DataFrame: a column per field of any row kind (None where a
    kind lacks it), keys from newer schema additions as their own columns, ``env.*`` for the
    environment and ``gpu{i}.*`` for the memory of the i-th GPU entry of a row."""
    import pandas as pd

    return pd.DataFrame([flat(r) for r in load(*paths)])


def flat(row: Row) -> dict[str, Any]:
    """One row as a flat record: nested environment and per-GPU memory spread into columns."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(row):
        value = getattr(row, f.name)
        if f.name == "extra":
            out.update(value)
        elif f.name == "env":
            out.update(_prefixed("env.", value) if value is not None else {})
        elif f.name == "gpus":
            for i, gpu in enumerate(value or []):
                out.update(_prefixed(f"gpu{i}.", gpu))
        else:
            out[f.name] = value
    return out


def _prefixed(prefix: str, part: Any) -> Iterator[tuple[str, Any]]:
    """A nested part's fields and the keys it keeps beyond them (``extra``) as flat columns."""
    for f in dataclasses.fields(part):
        if f.name != "extra":
            yield prefix + f.name, getattr(part, f.name)
    for k, v in part.extra.items():
        yield prefix + k, v


def _paths(paths: tuple[Any, ...]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out.extend([Path(p)] if isinstance(p, (str, Path)) else [Path(x) for x in p])
    if not out:
        raise AttnbenchError("give at least one results directory or trials.jsonl")
    return out
