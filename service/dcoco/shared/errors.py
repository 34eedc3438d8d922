"""Errors every layer may raise."""


class UsageError(Exception):
    """A problem with the user's input (a flag, a file, a setting); the CLI prints it as one line
    and exits with status 1."""
