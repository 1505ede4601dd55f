"""Errors that reach the user as one line and exit code 2, and the interrupts the signals raise."""

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# A signal handler's exception is lost where it lands in code whose exceptions Python ignores
# (an at-fork hook while a worker process is spawned): the signal is kept here too, and the
# loop that waits on a worker raises it again (raise_pending_interrupt).
_pending: type[KeyboardInterrupt] | None = None
# Inside ``interrupts_held``: a signal is only kept, raised by that loop.
_held = 0


class AttnbenchError(Exception):
    """Bad input or an unusable environment: the message names the fix."""


class ConfigError(AttnbenchError):
    """An implementation configuration or shape that cannot run."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: stops a run as Ctrl-C does (finished trials kept), but exits 128 + 15 = 143,
    so a supervisor sees the signal it sent."""


class HungUp(Terminated):
    """SIGHUP (a closed terminal or ssh session): stops a run as SIGTERM does (finished trials
    kept, tables written, the --resume line printed), exiting 128 + 1 = 129."""


class OutputClosed(KeyboardInterrupt):
    """The reader of stdout or stderr went away (``| head`` exited): the run stops as an
    interrupt does (finished trials kept), exiting 128 + SIGPIPE = 141 as a shell expects."""


class RunInterrupted(Exception):
    """An interrupt carried past typer, which would end the run with a silent exit 130 (SIGTERM's too)."""


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt ``exc`` is, or was directly caused by (an import the signal cut short
    fails with an ImportError whose cause is the interrupt); None for any other error."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        exc = exc.__cause__
    return None


def interrupt_exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C (128 + SIGINT), 143 for SIGTERM, 129 for SIGHUP, 141 for a closed output (SIGPIPE)."""
    if isinstance(exc, OutputClosed):
        return 128 + signal.SIGPIPE
    if isinstance(exc, HungUp):
        return 128 + signal.SIGHUP
    return 143 if isinstance(exc, Terminated) else 130


# The interrupt each handled signal raises.
INTERRUPTS: dict[int, type[KeyboardInterrupt]] = {signal.SIGTERM: Terminated, signal.SIGHUP: HungUp}


def interrupt_on_signal(signum: int, frame: object) -> None:
    """The handler of SIGINT, SIGTERM and SIGHUP: raise the interrupt, and keep it in case it is lost."""
    global _pending
    _pending = INTERRUPTS.get(signum, KeyboardInterrupt)
    if not _held:
        raise _pending


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Code that starts a worker and records it (where it will be killed): a signal that lands
    inside only sets the interrupt pending, so no worker is started and then forgotten by an
    exception between the two; the next wait on a worker raises it."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1


def raise_pending_interrupt() -> None:
    """Raise an interrupt whose signal arrived but whose exception may have been lost (see
    _pending). One whose exception did arrive stops the run before any later wait on a worker,
    so it is not raised twice."""
    global _pending
    exc, _pending = _pending, None
    if exc is not None:
        raise exc


def install_interrupt_handlers() -> None:
    """SIGINT, SIGTERM and SIGHUP raise their interrupts; one that Python would report as
    ignored is not printed (a traceback for an interrupt the run then honours) but raised again
    later. A SIGHUP ignored when attnbench started (``nohup``) stays ignored."""
    signal.signal(signal.SIGTERM, interrupt_on_signal)
    signal.signal(signal.SIGINT, interrupt_on_signal)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, interrupt_on_signal)
    sys.unraisablehook = _quiet_lost_interrupts


def _quiet_lost_interrupts(unraisable) -> None:
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)
