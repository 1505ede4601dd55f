"""Reading results files: every row under the given files or directories that is valid for
its kind's schema and physically possible, each trial once; every line skipped is named
``FILE:LINE`` with why. A FIFO or device at a results name is refused, never waited on."""

from __future__ import annotations

import gc
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.results.possible import MAX_DEPTH, check_possible, nesting_depth
from attnbench.results.schema import SCHEMA_VERSION, Environment, Row, SchemaError, row_from_json
from attnbench.results.write import TRIALS_FILE


def result_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.exists() and not path.is_dir():
        return [path]  # a file (read_lines refuses one that is not a regular file)
    if not path.exists():
        raise AttnbenchError(f"results path {path} does not exist: give a results directory or trials.jsonl")
    return sorted(path.rglob(TRIALS_FILE))


def distinct_paths(paths: Path | Iterable[Path]) -> tuple[Path, ...]:
    """Each results path once, in the order given (one named twice is read once)."""
    given = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    distinct: dict[Path, Path] = {}
    for p in given:
        distinct.setdefault(p.resolve(), p)
    return tuple(distinct.values())


def files_of(paths: tuple[Path, ...], empty: Callable[[Path], str]) -> list[Path]:
    """Every trials.jsonl under ``paths``, each once though a path given lies inside another;
    a path with none is a one-line error (``empty``: its text)."""
    files: dict[Path, Path] = {}
    for path in paths:
        found = result_files(path)  # raises when the path does not exist
        if not found:
            raise AttnbenchError(empty(path))
        for file in found:
            files.setdefault(file.resolve(), file)
    return list(files.values())


def paths_text(paths: tuple[Path, ...]) -> str:
    """The results paths read, as the command line gave them."""
    return " ".join(str(p) for p in paths)


def read_lines(file: Path, offset: int = 0) -> Iterator[bytes]:
    """A results file's lines, one at a time (a history of gigabytes is never held whole), from
    byte ``offset`` on, each with its newline; a FIFO or device at its name is refused, never
    waited on."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise AttnbenchError(f"cannot read {file} ({exc.strerror}): check its permissions") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AttnbenchError(f"{file} is not a regular file (a FIFO or device): give a results file or directory")
        try:
            f.seek(offset)
            yield from f
        except OSError as exc:
            raise AttnbenchError(f"cannot read {file} ({exc.strerror}): check its permissions") from None


# Keys a row of each kind cannot be used without; a row lacking one is skipped as incomplete.
REQUIRED_KEYS = {
    "max-seq": ("series", "seq_len", "status", "impl"),
    "points": ("series", "seq_len", "status", "impl"),
    "verify": ("impl", "status"),
    "max-seq-result": ("series",),
}


def read_rows(paths: Path | Iterable[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """All rows under the given files or directories, each valid for its kind's schema (with
    ``_file`` naming its file), and one ``FILE:LINE`` problem line per line skipped
    (undecodable, not JSON, not a valid or not a possible row: the field is named; a trial
    already read: counted once). A row of another schema version stops the read with one
    line: its meaning is not this code's."""
    rows, problems = [], []
    for row, _, file, _ in _valid_rows(paths, problems):
        row["_file"] = str(file)
        rows.append(row)
    return rows, problems


def load_rows(paths: Path | Iterable[Path], keep: Keep | None = None) -> tuple[list[Row], list[str]]:
    """The typed loader every reader uses: the rows of ``read_rows`` as schema objects
    (``Trial``, ``MaxSeqResult``, ``Verify``, ``Speedup``), each with ``source`` set to its
    ``FILE:LINE``, and the same ``FILE:LINE`` problem lines. ``keep``: a reader that needs some
    rows only (one implementation's) says which, from the decoded line; the others are
    neither checked nor typed nor held."""
    rows, problems = [], []
    _typed_into(rows, _valid_rows(paths, problems, keep))
    return rows, problems


def _typed_into(rows: list[Row], read: Iterable[tuple[dict[str, Any], Row, Path, int]]) -> None:
    """Append each typed row ``read`` gives, its ``source`` set to its ``FILE:LINE``."""
    with _no_cycle_collection():
        for _, row, file, lineno in read:
            row.source = f"{file}:{lineno}"
            rows.append(row)


@contextmanager
def _no_cycle_collection():
    """The cyclic garbage collector paused while rows are read: rows hold no cycles (refcounting
    frees them), and each collection of the oldest generation would walk every row held so far
    (a seventh of the reading's time at 20,000 rows)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# which decoded rows a reader needs (``load_rows``)
Keep = Callable[[dict[str, Any]], bool]


def _valid_rows(paths: Path | Iterable[Path], problems: list[str], keep: Keep | None = None):
    """(row, typed row, file, line) of every valid, possible row, each trial once; a skipped
    line is appended to ``problems``."""
    if isinstance(paths, (str, Path)):
        paths = [Path(paths)]
    reader = Reader(problems, keep)
    for root in paths:
        for file in result_files(Path(root)):
            yield from reader.rows(file)


class Reader:
    """Reads results files into valid, possible rows, each trial once, a skipped line named in
    ``problems``. Each row is read once, in time linear in the rows: the rows of one run share
    one environment, decoded, typed and checked once. A reader remembers what it read, so it can
    go on with a file from where it stopped (``History``) as if it had read the file whole."""

    def __init__(self, problems: list[str], keep: Keep | None = None) -> None:
        self.problems, self.keep = problems, keep
        self.seen: dict[str, str] = {}  # trial id -> FILE:LINE where it was first read
        self.envs = Environments()
        self.decode = LineDecoder()
        self.offset = self.lineno = 0  # where the last file read stopped: bytes, lines
        self.ended_line = True  # whether its last line had its newline (else a writer may add to it)

    def rows(self, file: Path, on: bool = False):
        """(row, typed row, file, line) of ``file``'s lines, from its start or (``on``) from where
        the last read of it stopped."""
        if not on:
            self.offset = self.lineno = 0
        self.ended_line = True
        for line in read_lines(file, self.offset):
            self.offset += len(line)
            self.lineno += 1
            self.ended_line = line.endswith(b"\n")
            raw = line.removesuffix(b"\n")
            if raw.strip():
                read = self._row(raw, f"{file}:{self.lineno}")
                if read is not None:
                    yield read[0], read[1], file, self.lineno

    def _row(self, raw: bytes, where: str) -> tuple[dict[str, Any], Row] | None:
        row, problem = self.decode(raw)
        if not problem:
            if self.keep is not None and not self.keep(row):
                return None  # a row this reader does not need: nothing of it is judged
            rest, problem = _usable(row, self.envs)
        if problem:
            self.problems.append(f"{where}: {problem}")
            return None
        if row.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise AttnbenchError(
                f"{where}: result schema {row.get('schema')!r} is not {SCHEMA_VERSION}; "
                "read it with the attnbench version that wrote it"
            )
        try:
            typed = self.envs.typed(row, rest)
        except SchemaError as exc:
            self.problems.append(f"{where}: invalid row skipped ({exc})")
            return None
        try:
            check_possible(row, rest)
        except SchemaError as exc:
            self.problems.append(f"{where}: impossible row skipped ({exc})")
            return None
        self.envs.accept(row, typed)
        trial = row.get("trial")
        if isinstance(trial, str) and trial in self.seen:
            self.problems.append(f"{where}: duplicate row skipped (trial {trial}, counted once at {self.seen[trial]})")
            return None
        if isinstance(trial, str):
            self.seen[trial] = where
        return row, typed


@dataclass
class History:
    """One results file as ``load_rows`` reads it, with what it takes to read on: a run that
    resumed from the file reads only the rows it appended for its closing files, not the file
    again."""

    file: Path
    rows: list[Row]
    problems: list[str]
    reader: Reader
    stamp: tuple[int, int]  # the file's device and inode

    @classmethod
    def read(cls, file: Path) -> History:
        history = cls(Path(file), [], [], Reader([]), (0, 0))
        history._from_start()
        return history

    def read_on(self) -> tuple[list[Row], list[str]]:
        """Every row and problem of the file now: those read before and those of the lines
        appended since (the whole file again where it was replaced or cut short, or where its last
        line read had no newline: what was appended may continue that line)."""
        moved = _identity(self.file) != self.stamp or self.file.stat().st_size < self.reader.offset
        if moved or not self.reader.ended_line:
            self._from_start()
        else:
            _typed_into(self.rows, self.reader.rows(self.file, on=True))
        return self.rows, self.problems

    def _from_start(self) -> None:
        self.rows, self.problems, self.stamp = [], [], _identity(self.file)
        self.reader = Reader(self.problems)
        _typed_into(self.rows, self.reader.rows(self.file))


def _identity(file: Path) -> tuple[int, int]:
    st = os.stat(file)
    return st.st_dev, st.st_ino


class Environments:
    """The environments of the rows accepted so far, each typed and checked once: a run's rows
    record the same one, which is read and held once, not once a row."""

    def __init__(self) -> None:
        self.known: dict[str, Environment] = {}
        # the last environment seen and its key: asked for again at each check of a row, and
        # a run's rows, one after another in its file, record an equal one
        self.last: tuple[Any, str] = (None, "")

    def key(self, env: dict[str, Any]) -> str:
        if env is not self.last[0]:
            self.last = (env, self.last[1] if env == self.last[0] else json.dumps(env))
        return self.last[1]

    def rest(self, row: dict[str, Any]) -> dict[str, Any]:
        """What is left to check of ``row``: all of it, or without an environment an accepted row had."""
        env = row.get("env")
        if isinstance(env, dict) and self.known.get(self.key(env)) is not None:
            return {**row, "env": None}
        return row

    def typed(self, row: dict[str, Any], rest: dict[str, Any]) -> Row:
        """``row`` as its kind's class (``row_from_json``); a SchemaError names its first bad field."""
        if rest is row:
            return row_from_json(row)
        typed = row_from_json(rest)  # the same environment, already checked
        typed.env = self.known[self.key(row["env"])]
        return typed

    def accept(self, row: dict[str, Any], typed: Row) -> None:
        """Hold the environment of a row that passed every check, for the rows after it."""
        if typed.env is not None:
            self.known.setdefault(self.key(row["env"]), typed.env)


class LineDecoder:
    """Decodes a results line as ``_decode`` does, the run's environment once: a row's last
    member is ``"env"``, the same text on every row of a run (over a third of a row's bytes).
    A line that ends with the text of the environment decoded last is decoded without it and
    given that environment; every other line, and any line the shortcut cannot decode, is
    decoded whole, so a bad line gets the same error either way."""

    SEPARATOR = b', "env": '  # how ``json.dumps`` writes the member (a quote inside a string is escaped)

    def __init__(self) -> None:
        self.tail = b""  # ', "env": {...}}': the end of the last line whose environment was read
        self.env: dict[str, Any] | None = None

    def __call__(self, raw: bytes) -> tuple[dict[str, Any], str]:
        if self.tail and raw.endswith(self.tail):
            row = self._without_env(raw[: -len(self.tail)])
            if row:
                row["env"] = self.env
                return row, ""
        row, problem = _decode(raw)
        if not problem and isinstance(row.get("env"), dict):
            self._learn(raw, row["env"])
        return row, problem

    @staticmethod
    def _without_env(head: bytes) -> dict[str, Any] | None:
        """The members before the environment as a row, or None where they do not decode to one."""
        try:
            row = json.loads(head.decode("utf-8") + "}")
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None
        return row if isinstance(row, dict) and "kind" in row else None

    def _learn(self, raw: bytes, env: dict[str, Any]) -> None:
        """Hold the line's environment text where its last member is exactly ``env``."""
        start = raw.rfind(self.SEPARATOR)
        if start < 0 or not raw.endswith(b"}"):
            return
        try:
            last = json.loads(raw[start + len(self.SEPARATOR) : -1])
        except (ValueError, RecursionError):
            return  # the separator found lies inside the environment: no shortcut for this run
        if last == env:
            self.tail, self.env = raw[start:], env


def _decode(raw: bytes) -> tuple[dict[str, Any], str]:
    """(the line as a row, why it is unreadable or "")."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return {}, f"unreadable line skipped (not UTF-8 at byte {exc.start})"
    except RecursionError:
        return {}, f"unreadable line skipped (nested deeper than a row's {MAX_DEPTH} levels)"
    except ValueError as exc:
        return {}, f"unreadable line skipped ({exc})"
    if not isinstance(row, dict) or "kind" not in row:
        return {}, "unreadable line skipped (not a result row: no 'kind')"
    return row, ""


def _usable(row: dict[str, Any], envs: Environments) -> tuple[dict[str, Any], str]:
    """(what is left to check of a decoded row: ``Environments.rest``, why it cannot be used or "")."""
    rest = envs.rest(row)
    depth = nesting_depth(rest)  # an accepted environment nests no deeper than a row may
    if depth > MAX_DEPTH:
        return {}, f"unreadable line skipped (nested {depth} levels deep, more than a row's {MAX_DEPTH})"
    missing = [k for k in REQUIRED_KEYS.get(row["kind"], ("status",)) if k not in row]
    if missing:
        return {}, f"incomplete {row['kind']} row skipped (no {', '.join(map(repr, missing))})"
    return rest, ""


def iter_rows(paths: Path | Iterable[Path]) -> Iterator[dict[str, Any]]:
    """The rows of ``read_rows`` one at a time as they are read, problems left unsaid: for a
    caller that needs only the first few, and stops there."""
    for row, _, file, _ in _valid_rows(paths, []):
        row["_file"] = str(file)
        yield row


def rows_to_resume(out_dir: Path, resume: bool, machine: str) -> tuple[list[Row], History | None]:
    """The rows a run may continue from, typed, those measured on ``machine`` only (a row of another
    machine is never replayed as this one's), and the directory's history they were read from;
    refuses to overwrite a results directory without ``resume``, and to mix machines in one
    directory."""
    trials = Path(out_dir) / TRIALS_FILE
    if not trials.exists():
        return [], None
    if not resume:
        raise AttnbenchError(f"{out_dir} already holds results: pass --resume to continue it or choose another --out")
    if trials.is_symlink():
        raise AttnbenchError(
            f"{trials} is a symbolic link: attnbench does not write through links; "
            "replace it with the file or choose another --out"
        )
    history = History.read(trials)
    rows = history.rows
    _refuse_another_machine(out_dir, machine, {r.env.machine for r in rows if r.env})
    return [r for r in rows if r.env and r.env.machine == machine], history


def _machine_of(row: dict[str, Any]) -> str | None:
    env = row.get("env")
    return env.get("machine") if isinstance(env, dict) else None


def check_same_machine(out_dir: Path, machine: str) -> list[dict[str, Any]]:
    """The rows already in ``out_dir``, refusing a directory measured on another machine."""
    trials = Path(out_dir) / TRIALS_FILE
    if not trials.exists():
        return []
    rows, _ = read_rows(trials)
    _refuse_another_machine(out_dir, machine, {_machine_of(r) for r in rows if r.get("env")})
    return rows


def _refuse_another_machine(out_dir: Path, machine: str, machines: set[str | None]) -> None:
    if machines and machine not in machines:
        raise AttnbenchError(
            f"{out_dir} was measured on {', '.join(sorted(map(str, machines)))}, this is {machine}: "
            "continue on the same machine or choose another --out"
        )
