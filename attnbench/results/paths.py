"""Output paths, checked before any work, and derived files written whole: a results
directory must be a writable directory that is not a link, with names the file system takes
and room for rows; tables and plots reach their name by an atomic rename."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
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


def utf8(text: str) -> bytes:
    """``text`` as a file holds it: UTF-8, whatever the locale. A path or argument that the
    file-system encoding could not decode (any non-ASCII byte in an ASCII locale, a byte that is
    not UTF-8 in any) holds its bytes as lone surrogates: they are written as those bytes where
    they are UTF-8, else escaped (``\\xff``)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no decoder made (from a JSON escape): shown, not written
        return text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace").encode("utf-8")


def write_text_atomic(path: Path, text: str) -> None:
    """Write a derived file (CSV, markdown) so a reader never sees half of it: through an
    unpredictable temporary name in the target directory (created exclusively, so a planted
    link is never followed), then renamed over the target."""
    write_bytes_atomic(path, utf8(text))


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
    directory inside ``out_dir`` first; then every name the new set goes to and every file of
    the previous set is checked (a link or directory in the way, a read-only file, a directory
    that cannot take a rename), and only then does the first rename happen. The previous files
    are moved aside, not deleted, until the new set is in place: a rename that still fails puts
    them back. Either way ``out_dir`` holds one whole report, and an error names the file.
    Returns the paths written."""
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
        write_bytes_atomic(staging / MANIFEST, utf8("".join(f"{name}\n" for name in files)))
        previous = _previous(out_dir, set(files))
        for path in [*targets.values(), *previous, out_dir / MANIFEST]:
            _check_replaceable(path)
        _swap(out_dir, staging, [*files, MANIFEST], previous)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return list(targets.values())


def _previous(out_dir: Path, keep: set[str]) -> list[Path]:
    """The files the manifest names that the new set does not replace; never a path outside
    ``out_dir`` (a manifest is a file anyone could edit), never a link's target."""
    try:
        names = (out_dir / MANIFEST).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    root = out_dir.resolve()
    found = []
    for name in dict.fromkeys(names):
        path = out_dir / name
        if name and name not in keep and root in path.resolve().parents and (path.is_file() or path.is_symlink()):
            found.append(path)
    return found


def _check_replaceable(path: Path) -> None:
    """Before any rename: ``path`` can be replaced (or removed) by a rename in its directory,
    and is no file its owner marked read-only."""
    folder = path.parent
    while not folder.exists():  # a folder the new set creates (csv/) is made in the nearest that exists
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AttnbenchError(f"cannot write {path}: {folder} is not writable; make it writable or choose another --out")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise AttnbenchError(f"cannot write {path} ({exc.strerror}): {why_not_written(exc)}") from None
    if stat.S_ISREG(mode) and (not mode & 0o222 or not os.access(path, os.W_OK)):
        raise AttnbenchError(
            f"cannot write {path}: it is read-only; make it writable (chmod u+w) or choose another --out"
        )


def _swap(out_dir: Path, staging: Path, names: list[str], previous: list[Path]) -> None:
    """Move the previous files aside into ``staging``, then the new ones into place; a rename
    that fails puts everything back as it was and is one AttnbenchError naming its file."""
    aside = staging / ".previous"
    moved: list[tuple[Path, Path]] = []  # (where a previous file was, where it is now)
    placed: list[Path] = []  # the new files in place
    made: list[Path] = []  # folders made for them
    path = out_dir
    try:
        for i, path in enumerate([*(out_dir / n for n in names), *previous]):
            if os.path.lexists(path):
                keep = aside / str(i)
                keep.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, keep)
                moved.append((path, keep))
        for name in names:
            path = out_dir / name
            for folder in reversed(path.relative_to(out_dir).parents):
                if not (out_dir / folder).exists():
                    (out_dir / folder).mkdir()
                    made.append(out_dir / folder)
            os.replace(staging / name, path)
            placed.append(path)
    except OSError as exc:
        lost = _put_back(placed, moved, made)
        state = f"{lost} of the previous files could not be put back" if lost else "the previous report is as it was"
        raise AttnbenchError(f"cannot write {path} ({exc.strerror}): {why_not_written(exc)}; {state}") from None
    for gone in previous:  # csv/, when the new report has none
        if gone.parent != out_dir and gone.parent.is_dir() and not any(gone.parent.iterdir()):
            gone.parent.rmdir()


def _put_back(placed: list[Path], moved: list[tuple[Path, Path]], made: list[Path]) -> int:
    """Undo a part-made swap: the new files out, the previous ones back, the new folders gone;
    how many previous files could not be put back."""
    lost = 0
    for done in placed:
        with contextlib.suppress(OSError):
            done.unlink()
    for where, keep in reversed(moved):
        try:
            os.replace(keep, where)
        except OSError:
            lost += 1
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()
    return lost
