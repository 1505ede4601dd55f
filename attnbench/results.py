"""The result schema: one JSON object per trial, appended to ``trials.jsonl`` as each ends.

Every row carries the environment it ran in (captured by ``attnbench.environment``), its raw
timing samples and per-GPU memory, so reports and the regression check read result files and
nothing else. A killed sweep loses
at most the trial in flight: each row is one ``write`` of one line, flushed and synced, and
a reader skips (and reports) a truncated last line.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.schema import SCHEMA_VERSION, Row, SchemaError, row_from_json, validate

TRIALS_FILE = "trials.jsonl"
# Trial statuses; everything but "ok" is a failure that stops a max-seq search.
#   oom          the device allocator (or the CPU allocator under --memory-limit) refused
#   host-oom     the kernel's OOM killer ended the process (evidence: cgroup oom_kill, RSS at the limit)
#   killed       any other signal from outside attnbench
#   time-limit   a warm call took longer than max_trial_seconds
#   unsupported  the library says the shape or dtype is not supported
#   error        anything else
STATUSES = ("ok", "oom", "host-oom", "killed", "time-limit", "unsupported", "error")
# What stopped a max-seq search, in words, by the status of its first failure.
STOPPED_BY = {
    "oom": "memory",
    "host-oom": "host memory",
    "time-limit": "time",
    "cap": "max-seq-len cap",
    "killed": "killed",
    "unsupported": "unsupported shape",
}
LOCK_FILE = ".attnbench.lock"


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def series_key(workload: dict[str, Any], world_size: int = 1, strategy: str = "single", kind: str = "max-seq") -> str:
    """Identity of a sweep line: everything about a trial except its sequence length."""
    ident = {k: v for k, v in workload.items() if k != "seq_len"}
    ident.update(world_size=world_size, strategy=strategy, kind=kind)
    blob = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


class ResultsWriter:
    """Appends rows to ``DIR/trials.jsonl``; each row is one line written at once, and only
    a row its kind's schema accepts (a writer that breaks the schema fails at once).

    Before its first row it repairs a torn last line (a sweep killed mid-write): the fragment
    moves to ``trials.jsonl.torn`` so the next row starts a line of its own. It never writes
    through a symbolic link."""

    def __init__(self, out_dir: Path, warn: Callable[[str], None] | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / TRIALS_FILE
        self.warn = warn or (lambda text: print(f"warning: {text}", file=sys.stderr))
        self._repaired = False

    def append(self, row: dict[str, Any]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if not self._repaired:
            self._repaired = True
            note = repair_torn_tail(self.path)
            if note:
                self.warn(note)
        row = {"schema": SCHEMA_VERSION, **row}
        line = json.dumps(row, default=_jsonable, allow_nan=False) + "\n"
        validate(json.loads(line))  # the row as a reader will see it
        fd = _open_no_follow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _open_no_follow(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o666)  # the umask decides, as for any file
    except OSError as exc:
        if Path(path).is_symlink():
            raise AttnbenchError(
                f"{path} is a symbolic link: attnbench does not write through links; "
                "replace it with the file or choose another --out"
            ) from None
        raise AttnbenchError(f"cannot write {path} ({exc.strerror}): choose a writable --out") from None


def repair_torn_tail(path: Path) -> str | None:
    """Cut a last line that lacks its newline off ``path`` and keep it in ``PATH.torn``;
    returns the ``FILE:LINE`` note, or None when the file ends cleanly."""
    path = Path(path)
    if not path.exists():
        return None
    fd = _open_no_follow(path, os.O_RDWR)
    try:
        data = b""
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        os.lseek(fd, size - 1, os.SEEK_SET)
        if os.read(fd, 1) == b"\n":
            return None
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, size)
        cut = data.rfind(b"\n") + 1
        lineno = data.count(b"\n", 0, cut) + 1
        torn = path.with_name(path.name + ".torn")
        keep = _open_no_follow(torn, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(keep, data[cut:] + b"\n")
            os.fsync(keep)
        finally:
            os.close(keep)
        os.ftruncate(fd, cut)
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"{path}:{lineno}: torn last line ({size - cut} bytes) moved to {torn}"


class ResultsLock:
    """An exclusive lock on a results directory for a whole run: a second run into the same
    ``--out`` stops with one line instead of recording every trial twice."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.fd: int | None = None

    def __enter__(self) -> ResultsLock:
        import fcntl

        self.out_dir.mkdir(parents=True, exist_ok=True)
        fd = _open_no_follow(self.out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise AttnbenchError(
                f"another attnbench run is writing to {self.out_dir}: wait for it to finish or choose another --out"
            ) from None
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock; the file stays, unlinking it would race
            self.fd = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in a result row")


def clean_floats(row: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinity are not JSON: store them as null."""

    def fix(v):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return fix(row)


def result_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise AttnbenchError(f"results path {path} does not exist: give a results directory or trials.jsonl")
    return sorted(path.rglob(TRIALS_FILE))


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
    (undecodable, not JSON, or not a valid row: the field is named). A row of another schema
    version stops the read with one line: its meaning is not this code's."""
    rows, problems = [], []
    for row, file, _ in _valid_rows(paths, problems):
        row["_file"] = str(file)
        rows.append(row)
    return rows, problems


def load_rows(paths: Path | Iterable[Path]) -> tuple[list[Row], list[str]]:
    """The typed loader every reader uses: the rows of ``read_rows`` as schema objects
    (``Trial``, ``MaxSeqResult``, ``Verify``, ``Speedup``), each with ``source`` set to its
    ``FILE:LINE``, and the same ``FILE:LINE`` problem lines."""
    rows, problems = [], []
    for d, file, lineno in _valid_rows(paths, problems):
        row = row_from_json(d)
        row.source = f"{file}:{lineno}"
        rows.append(row)
    return rows, problems


def _valid_rows(paths: Path | Iterable[Path], problems: list[str]):
    """(row, file, line) of every valid row; a skipped line is appended to ``problems``."""
    if isinstance(paths, (str, Path)):
        paths = [Path(paths)]
    for root in paths:
        for file in result_files(Path(root)):
            try:
                data = file.read_bytes()
            except OSError as exc:
                raise AttnbenchError(f"cannot read {file} ({exc.strerror}): check its permissions") from None
            for lineno, raw in enumerate(data.split(b"\n"), 1):
                if not raw.strip():
                    continue
                row, problem = _parse_line(raw)
                if problem:
                    problems.append(f"{file}:{lineno}: {problem}")
                    continue
                if row.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
                    raise AttnbenchError(
                        f"{file}:{lineno}: result schema {row.get('schema')!r} is not {SCHEMA_VERSION}; "
                        "read it with the attnbench version that wrote it"
                    )
                try:
                    validate(row)
                except SchemaError as exc:
                    problems.append(f"{file}:{lineno}: invalid row skipped ({exc})")
                    continue
                yield row, file, lineno


def _parse_line(raw: bytes) -> tuple[dict[str, Any], str]:
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return {}, f"unreadable line skipped (not UTF-8 at byte {exc.start})"
    except ValueError as exc:
        return {}, f"unreadable line skipped ({exc})"
    if not isinstance(row, dict) or "kind" not in row:
        return {}, "unreadable line skipped (not a result row: no 'kind')"
    missing = [k for k in REQUIRED_KEYS.get(row["kind"], ("status",)) if k not in row]
    if missing:
        return {}, f"incomplete {row['kind']} row skipped (no {', '.join(map(repr, missing))})"
    return row, ""


def rows_to_resume(out_dir: Path, resume: bool, machine: str) -> list[dict[str, Any]]:
    """The rows a run may continue from: refuses to overwrite a results directory without
    ``resume``, and to mix machines in one directory."""
    trials = Path(out_dir) / TRIALS_FILE
    if not trials.exists():
        return []
    if not resume:
        raise AttnbenchError(f"{out_dir} already holds results: pass --resume to continue it or choose another --out")
    if trials.is_symlink():
        raise AttnbenchError(
            f"{trials} is a symbolic link: attnbench does not write through links; "
            "replace it with the file or choose another --out"
        )
    return check_same_machine(out_dir, machine)


def check_same_machine(out_dir: Path, machine: str) -> list[dict[str, Any]]:
    """The rows already in ``out_dir``, refusing a directory measured on another machine."""
    trials = Path(out_dir) / TRIALS_FILE
    if not trials.exists():
        return []
    rows, _ = read_rows(trials)
    machines = {r.get("env", {}).get("machine") for r in rows if r.get("env")}
    if machines and machine not in machines:
        raise AttnbenchError(
            f"{out_dir} was measured on {', '.join(sorted(map(str, machines)))}, this is {machine}: "
            "continue on the same machine or choose another --out"
        )
    return rows


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Before any work: the results directory must be a directory we can create and write."""
    path = Path(path)
    if path.is_symlink() and not path.is_dir():
        raise AttnbenchError(f"{option} {path} is a dangling symbolic link: give a directory")
    if path.exists() and not path.is_dir():
        raise AttnbenchError(f"{option} {path} is a file, not a directory: give a directory path")
    _check_writable(path, option)


def check_output_file(path: Path, option: str, suffix: str) -> None:
    """Before any work: an output file with the right extension in a writable place."""
    path = Path(path)
    if path.suffix.lower() != suffix:
        raise AttnbenchError(f"{option} {path}: the file is written as {suffix[1:].upper()}; name it with {suffix}")
    if path.is_dir():
        raise AttnbenchError(f"{option} {path} is a directory: give a file name ending in {suffix}")
    _check_writable(path.parent, option)


def _check_writable(path: Path, option: str) -> None:
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise AttnbenchError(f"{option} {path}: {existing} is a file, not a directory; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise AttnbenchError(f"{option} {path}: {existing} is not writable; choose a writable directory")


def write_text_atomic(path: Path, text: str) -> None:
    """Write a derived file (CSV, markdown) so a reader never sees half of it: through an
    unpredictable temporary name in the target directory (created exclusively, so a planted
    link is never followed), then renamed over the target."""
    write_bytes_atomic(path, text.encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path, data: bytes) -> None:
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 is for the temporary name, not the result
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
