"""Errors that reach the user as one line and exit code 2, and the interrupt SIGTERM raises."""


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
