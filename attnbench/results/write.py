"""Writing a results file: each row one line, appended and synced the moment its trial ends,
every write checked. A row the file system cannot take whole (no space, a file-size limit) is
cut back off and the run stops with one line, so every row written before stays readable; a
line torn by a kill is moved aside before the next row. Nothing is written through a link or
into anything but a regular file; one run holds a directory at a time (``ResultsLock``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.results.schema import SCHEMA_VERSION, digest, validate, workload_identity

TRIALS_FILE = "trials.jsonl"
# Trial statuses; everything but "ok" is a failure that stops a max-seq search.
#   oom          the device allocator (or the CPU allocator under --memory-limit) refused
#   host-oom     the kernel's OOM killer ended the process (evidence: cgroup oom_kill, RSS at the limit)
#   killed       any other signal from outside attnbench
#   time-limit   a warm call took longer than max_trial_seconds
#   unsupported  the library says the shape or dtype is not supported
#   error        anything else
STATUSES = ("ok", "oom", "host-oom", "killed", "time-limit", "unsupported", "error")
# The stop status of a max-seq search its time budget ended before its bracket closed.
BUDGET = "budget"
# What stopped a max-seq search, in words, by the status of its first failure.
STOPPED_BY = {
    "oom": "memory",
    "host-oom": "host memory",
    "time-limit": "time",
    "cap": "max-seq-len cap",
    BUDGET: "search time budget",
    "killed": "killed",
    "unsupported": "unsupported shape",
}
LOCK_FILE = ".attnbench.lock"


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def series_key(
    workload: Mapping[str, Any], world_size: int = 1, strategy: str = "single", kind: str = "max-seq"
) -> str:
    """The ``series`` a row stores: its workload's identity but its length, how it is spread
    and the sweep kind; a model preset's series also names its preset (as it always has)."""
    ident = workload_identity({**workload, "world_size": world_size, "strategy": strategy}, seq_len=False)
    if workload.get("model") is not None:
        ident["model"] = workload["model"]
    return digest({**ident, "kind": kind}, 12)


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
        """Append one row, or raise one AttnbenchError line when it cannot be written whole
        (a full file system, a file-size limit): the partial line is cut off again, so every
        row written before stays readable and the file ends on a line of its own."""
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
            end = os.fstat(fd).st_size
            try:
                _write_all(fd, line.encode())
                os.fsync(fd)
            except OSError as exc:
                raise AttnbenchError(self._cut_back(fd, end, exc)) from None
        finally:
            os.close(fd)

    def _cut_back(self, fd: int, end: int, exc: OSError) -> str:
        """Truncate a row that was not written whole; the message for the failed write."""
        why = f"cannot write a result row to {self.path} ({exc.strerror or exc})"
        fix = "free space, then run the same command with --resume"
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        except OSError:
            return f"{why}, nor cut the partial row off (a resumed run moves it aside): {fix}"
        return f"{why}: the run stops here and every row written before is kept; {fix}"


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written: a short write is retried, and the retry
    raises the file system's error (ENOSPC, EFBIG) when no more fits."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _open_no_follow(path: Path, flags: int) -> int:
    """Open a results file for writing: never through a symbolic link, and only a regular
    file (O_NONBLOCK: a FIFO planted at the name must not block the open)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)  # the umask decides, as for any file
    except OSError as exc:
        if Path(path).is_symlink():
            raise AttnbenchError(
                f"{path} is a symbolic link: attnbench does not write through links; "
                "replace it with the file or choose another --out"
            ) from None
        if os.path.lexists(path) and not Path(path).is_file():
            raise _not_regular(Path(path)) from None
        raise AttnbenchError(f"cannot write {path} ({exc.strerror}): choose a writable --out") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_regular(Path(path))
    return fd


def _not_regular(path: Path) -> AttnbenchError:
    return AttnbenchError(
        f"{path} is not a regular file (a FIFO, device or directory): results are plain files; "
        "remove it or choose another --out"
    )


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
            _write_all(keep, data[cut:] + b"\n")
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
        while True:
            fd = _open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise AttnbenchError(
                    f"another attnbench run is writing to {self.out_dir}: wait for it to finish or choose another --out"
                ) from None
            if self._still_named(fd):
                self.fd = fd
                return self
            os.close(fd)  # the run before us removed it between our open and our lock: take the new one

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            # removed while held, so no run finds it after us; a run that opened it before
            # this sees it gone once it holds it (_still_named) and opens the path again. A
            # directory that became read-only keeps the file (a lock nobody holds locks
            # nothing), and whatever error ended the run is the one reported, not this.
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os.close(self.fd)
            self.fd = None

    @property
    def path(self) -> Path:
        return self.out_dir / LOCK_FILE

    def _still_named(self, fd: int) -> bool:
        """Whether the lock file we hold is still the one at its path."""
        try:
            return os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in a result row")
