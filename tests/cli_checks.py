"""Shared assertions for command-line tests."""


def one_line(err: str, message: str) -> None:
    """A user error: the message, on one line of stderr, and no traceback."""
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
