"""The one exception type for user-facing failures.

Anything raised as ``TvmpipeError`` is the user's to fix (a bad file, an unknown target, a wrong input);
the CLI prints its message on one line and exits non-zero. Every other exception is a bug in tvmpipe.
"""


class TvmpipeError(Exception):
    """A failure caused by the input; the message names the file, node, op or input at fault."""


def summary(err: BaseException) -> str:
    """``err`` in one line: its type and the last line of its message (TVM's errors end with the message itself,
    after an IR dump and a C++ traceback)."""
    last = (str(err).strip().splitlines() or [""])[-1].removeprefix("Error message: ")
    return f"{type(err).__name__}: {last}"
