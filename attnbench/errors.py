"""Errors that reach the user as one line and exit code 2, and the interrupts the signals raise."""

import threading

# A signal handler's exception is lost where it lands in code whose exceptions Python ignores
# (an at-fork hook while a worker process is spawned): the signal is kept here too, and the
# loops that wait on workers raise it again (raise_pending_interrupt).
_pending: list[type[KeyboardInterrupt]] = []
_pending_lock = threading.Lock()


class AttnbenchError(Exception):
    """Bad input or an unusable environment: the message names the fix."""


class ConfigError(AttnbenchError):
    """An implementation configuration or shape that cannot run."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: stops a run as Ctrl-C does (finished trials kept), but exits 128 + 15 = 143,
    so a supervisor sees the signal it sent."""


def interrupt_exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C (128 + SIGINT), 143 for SIGTERM."""
    return 143 if isinstance(exc, Terminated) else 130


def interrupt_on_signal(signum: int, frame: object) -> None:
    """The handler of SIGINT and SIGTERM: raise the interrupt, and keep it in case it is lost."""
    import signal

    exc = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    with _pending_lock:
        _pending[:] = [exc]
    raise exc


def raise_pending_interrupt() -> None:
    """Raise an interrupt whose signal arrived but whose exception was lost (see _pending)."""
    with _pending_lock:
        exc = _pending.pop() if _pending else None
    if exc is not None:
        raise exc


def install_interrupt_handlers() -> None:
    """SIGINT and SIGTERM raise their interrupts; one that Python would report as ignored is
    not printed (a traceback for an interrupt the run then honours) but raised again later."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, interrupt_on_signal)
    signal.signal(signal.SIGINT, interrupt_on_signal)
    sys.unraisablehook = _quiet_lost_interrupts


def _quiet_lost_interrupts(unraisable) -> None:
    import sys

    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)


def forget_pending_interrupt() -> None:
    """The interrupt reached its handler: it must not be raised a second time."""
    with _pending_lock:
        _pending.clear()
