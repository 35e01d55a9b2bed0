"""Errors a user can act on.

Every error raised for bad input names the problem and the fix in one line;
the CLI prints that line and exits with status 2.
"""


class FedfairError(Exception):
    """Base class of every error fedfair raises on purpose."""


class ConfigError(FedfairError, ValueError):
    """A setting, flag, plan entry or input file is invalid; the message says how to fix it."""
