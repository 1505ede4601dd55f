"""The attnbench command line: each command is a thin call into the library.

One module per command group registers its commands on ``base.app`` with ``@app.command(...,
order=N)`` (N its place in ``attnbench --help``): ``verify`` (list, verify), ``models`` (the
model presets), ``sweep`` (max-seq, bench, run), ``report``, ``predict``, ``check``,
``speedup``, ``pattern``; every module here is imported, so a new group is a new module.
``progress`` holds the live progress reporters and ``options`` what several commands share. A command imports its machinery inside the function, so `attnbench report`
and `attnbench check` never import torch.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from attnbench.cli.base import app, err_console, guard_streams
from attnbench.errors import (
    AttnbenchError,
    OutputClosed,
    install_interrupt_handlers,
    interrupt_behind,
    interrupt_exit_code,
)
from attnbench.registry import import_all

# every module of this package: each command group registers its commands on ``app``
import_all(__name__)


def main() -> None:
    """Console entry: one-line errors with exit 2, never a traceback for bad input."""
    guard_streams()
    install_interrupt_handlers()
    try:
        args = _replay_resumed(sys.argv[1:])
        code = app(args=args, standalone_mode=False)  # click returns a typer.Exit's code here
        sys.exit(code if isinstance(code, int) else 0)
    except AttnbenchError as exc:
        err_console.print(f"error: {escape(error_line(str(exc)))}", soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _interrupted(exc)
    except Exception as exc:
        interrupt = interrupt_behind(exc)
        if interrupt is not None:  # before or between trials (a sweep keeps its own trials)
            _interrupted(interrupt)
        # click's (or typer's vendored click's) usage errors and Abort, whichever is installed
        if type(exc).__name__ == "Abort":
            err_console.print("interrupted")
            sys.exit(130)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            err_console.print(f"error: {escape(error_line(exc.format_message()))} (see --help)")
            sys.exit(2)
        raise


# An error is one line of at most this many characters: click echoes a bad option's value
# whole, and a value can be a file's worth.
ERROR_CHARS = 1000


def error_line(message: str) -> str:
    """``message`` on one line, cut to ERROR_CHARS."""
    line = " ".join(message.split())
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."


def _interrupted(interrupt: KeyboardInterrupt) -> None:
    """Exit as the interrupt asks; a reader that went away (``list | head``) is a quiet exit:
    nothing was lost that a word could save (a sweep names its resume line itself)."""
    if not isinstance(interrupt, OutputClosed):
        err_console.print("interrupted")
    sys.exit(interrupt_exit_code(interrupt))


def _replay_resumed(args: list[str]) -> list[str]:
    """`CMD --resume --out DIR` alone runs the command DIR's rows recorded (cli/resume.py)."""
    import shlex

    from attnbench.cli.resume import replayed_argv

    replayed = replayed_argv(args)
    if replayed != args:
        err_console.print(f"resuming: attnbench {escape(shlex.join(replayed))}")
        sys.argv = [sys.argv[0], *replayed]  # the rows record the command that ran
    return replayed


__all__ = ["app", "main"]
