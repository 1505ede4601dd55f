"""The Typer app every command registers on, the two consoles commands print to, and the
short forms of values that several commands show."""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from attnbench.errors import OutputClosed, RunInterrupted


def _without_flag_metavars(params: list) -> list:
    """typer shows a flag's type as if it took a value (`--resume <bool>`); a flag takes none."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    return params


class _Command(TyperCommand):
    def get_params(self, ctx):
        return _without_flag_metavars(super().get_params(ctx))


class _Group(TyperGroup):
    def get_params(self, ctx):
        return _without_flag_metavars(super().get_params(ctx))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # past typer to main(), which tells Ctrl-C from SIGTERM
            raise RunInterrupted() from exc


class _App(typer.Typer):
    """Every command is a _Command; `attnbench --help` lists them by their ``order``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.orders: dict[Callable, int] = {}

    def command(self, *args, order: int, **kwargs):
        """Register the decorated function as a command, ``order`` its place in `attnbench
        --help` (in steps of 10, so a new command fits between two)."""
        register = super().command(*args, cls=kwargs.pop("cls", None) or _Command, **kwargs)

        def registered(f: Callable) -> Callable:
            self.orders[f] = order
            f = register(f)
            self.registered_commands.sort(key=lambda c: self.orders[c.callback])
            return f

        return registered


app = _App(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="How long a sequence can an attention implementation handle, how fast, with how much memory per GPU.",
)


def _print_version(value: bool) -> None:
    if value:
        from attnbench import __version__

        print(f"attnbench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit"),
    ] = None,
) -> None:
    """How long a sequence can an attention implementation handle, how fast, with how much memory per GPU."""


class GuardedStream:
    """stdout or stderr as the command line uses it: a character its encoding lacks is
    written escaped, never raised, and a reader that went away (``| head`` exited) sends the
    rest of the output to /dev/null and stops the run as an interrupt does (once, in the main
    thread: a trial's heartbeat thread that meets the closed pipe leaves the stop to the main
    thread's next line); a terminal that is gone (hung up: the write fails with EIO) sends it
    there too, and the run, stopping on its SIGHUP, still writes its tables."""

    def __init__(self, stream, fd: int) -> None:
        self.stream, self.fd = stream, fd
        self._stop_pending = False
        stream.reconfigure(errors="backslashreplace")

    def write(self, text: str) -> int:
        self._stop_if_pending()
        return self._guarded(self.stream.write, text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            self._to_null()
            self._stop_pending = True
            self._stop_if_pending()
            return None
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            self._to_null()
            return 0

    def _stop_if_pending(self) -> None:
        if self._stop_pending and threading.current_thread() is threading.main_thread():
            self._stop_pending = False
            raise OutputClosed() from None

    def _to_null(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self.fd)  # later writes and the interpreter's last flush go nowhere, quietly
        os.close(null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def guard_streams() -> None:
    """Before any output: standard descriptors a caller closed (``>&-``) are /dev/null, so no
    file the run opens takes their number; stdout and stderr are guarded (GuardedStream)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None:  # Python found the descriptor closed at start
            stream = open(fd, "w", buffering=1, closefd=False)  # the interpreter's own, never closed
        if not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream, fd))


def _is_terminal() -> bool:
    return bool(sys.stdout and sys.stdout.isatty())


# Logs and CI captures are not terminals: give tables room instead of rich's 80 columns.
console = Console(highlight=False, soft_wrap=True, width=None if _is_terminal() else 160)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)  # "pkg.mod:x:" stays text


def show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def config_short(config: dict[str, Any]) -> str:
    return (
        " ".join(f"{k}={show(v)}" for k, v in config.items() if k != "max_chunk_tokens" and v not in (None, "")) or "-"
    )
