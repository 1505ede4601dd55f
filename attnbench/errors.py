"""Errors that reach the user as one line and exit code 2."""


class AttnbenchError(Exception):
    """Bad input or an unusable environment: the message names the fix."""


class ConfigError(AttnbenchError):
    """An implementation configuration or shape that cannot run."""
