"""Output paths, checked before any work, and derived files written whole: a results
directory must be a writable directory that is not a link, with names the file system takes
and room for rows; tables and plots reach their name by an atomic rename."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from attnbench.errors import AttnbenchError

# Free space below which a results directory is refused before any work: a few hundred rows.
MIN_FREE_BYTES = 1 << 20


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Before any work: the results directory must be a directory we can create and write,
    not a symbolic link (nothing is written through links), with names the file system
    takes and room for rows."""
    path = Path(path)
    existing = _check_names(path, option)
    if path.is_symlink():
        raise AttnbenchError(
            f"{option} {path} is a symbolic link (to {os.readlink(path)}): attnbench does not write through "
            "links; give the directory itself"
        )
    if path.exists() and not path.is_dir():
        raise AttnbenchError(f"{option} {path} is a file, not a directory: give a directory path")
    _check_writable(path, option)
    _check_free(existing, path, option)


def check_output_file(path: Path, option: str, suffix: str) -> None:
    """Before any work: an output file with the right extension in a writable place."""
    path = Path(path)
    if path.suffix.lower() != suffix:
        raise AttnbenchError(f"{option} {path}: the file is written as {suffix[1:].upper()}; name it with {suffix}")
    _check_names(path, option)
    if path.is_dir():
        raise AttnbenchError(f"{option} {path} is a directory: give a file name ending in {suffix}")
    _check_writable(path.parent, option)


def _check_names(path: Path, option: str) -> Path:
    """Refuse a name the file system cannot hold (os.stat would fail with ENAMETOOLONG);
    returns the nearest existing directory."""
    existing = Path(os.path.abspath(path))
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        name_max = os.pathconf(existing if existing.is_dir() else existing.parent, "PC_NAME_MAX")
        path_max = os.pathconf(existing if existing.is_dir() else existing.parent, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise AttnbenchError(
                f"{option}: a name of {len(os.fsencode(part))} bytes ({part[:24]}...) is longer than the file "
                f"system's {name_max}; choose a shorter name"
            )
    if len(os.fsencode(os.path.abspath(path))) >= path_max:
        raise AttnbenchError(
            f"{option}: the path is longer than the file system's {path_max} bytes; choose a shorter one"
        )
    return existing


def _check_writable(path: Path, option: str) -> None:
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise AttnbenchError(f"{option} {path}: {existing} is a file, not a directory; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise AttnbenchError(f"{option} {path}: {existing} is not writable; choose a writable directory")


def _check_free(existing: Path, path: Path, option: str) -> None:
    try:
        fs = os.statvfs(existing)
    except OSError:
        return  # nothing to say before the first write, which is checked
    free = fs.f_bavail * fs.f_frsize
    if free < MIN_FREE_BYTES:
        raise AttnbenchError(
            f"{option} {path}: its file system has {free:,} bytes free, too little for results; "
            "free space or choose another --out"
        )


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
    """``write_text_atomic`` for bytes (a PNG); a write that fails (a full file system) is
    one AttnbenchError and leaves the target as it was."""
    import tempfile

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise AttnbenchError(f"cannot write {path} ({exc.strerror}): choose a writable place") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 is for the temporary name, not the result
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise AttnbenchError(f"cannot write {path} ({exc.strerror}): {why_not_written(exc)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def why_not_written(exc: OSError) -> str:
    """The fix a failed write asks for, by its cause (a full disk is not a read-only one)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space or choose another place"
    if exc.errno == errno.EFBIG:
        return "raise the file-size limit (ulimit -f) or choose another place"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make it writable or choose another place"
    if exc.errno == errno.EISDIR:
        return "a directory holds its name; move it or choose another place"
    return "choose another place"


# The names a report wrote, one a line, kept beside it: the next report into the same
# directory removes those (and only those) before it moves its own files in.
MANIFEST = ".attnbench-report"


def write_files_whole(out_dir: Path, files: dict[str, bytes]) -> list[Path]:
    """Replace the files a previous call wrote into ``out_dir`` by ``files`` (relative name ->
    bytes), leaving every other file there alone. Everything is written into a temporary
    directory inside ``out_dir`` first; only when all of it is written, and every name it
    goes to can take a file, is the previous set removed and the new one moved into place:
    a failure before that leaves ``out_dir`` as it was. Returns the paths written."""
    out_dir = Path(out_dir)
    targets = {name: out_dir / name for name in files}
    for path in targets.values():
        if path.is_symlink() or (path.exists() and not path.is_file()):
            what = "a link" if path.is_symlink() else "a directory"
            raise AttnbenchError(f"cannot write {path}: {what} holds its name; move it or choose another --out")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".staging-"))
    except OSError as exc:
        raise AttnbenchError(f"cannot write into {out_dir} ({exc.strerror}): {why_not_written(exc)}") from None
    try:
        for name, data in files.items():
            write_bytes_atomic(staging / name, data)
        write_bytes_atomic(staging / MANIFEST, "".join(f"{name}\n" for name in files).encode("utf-8"))
        _remove_previous(out_dir, set(files))
        for name, path in targets.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, path)
        os.replace(staging / MANIFEST, out_dir / MANIFEST)
    except OSError as exc:
        raise AttnbenchError(f"cannot write into {out_dir} ({exc.strerror}): {why_not_written(exc)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return list(targets.values())


def _remove_previous(out_dir: Path, keep: set[str]) -> None:
    """The files the manifest names that the new set does not replace; never a path outside
    ``out_dir`` (a manifest is a file anyone could edit), never a link's target."""
    try:
        names = (out_dir / MANIFEST).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return
    root = out_dir.resolve()
    for name in names:
        path = out_dir / name
        if not name or name in keep or root not in path.resolve().parents:
            continue
        if path.is_file() or path.is_symlink():
            path.unlink()
            if path.parent != out_dir and not any(path.parent.iterdir()):
                path.parent.rmdir()  # csv/, when the new report has none
