"""The one exception type for user-facing failures.

Anything raised as ``TvmpipeError`` is the user's to fix (a bad file, an unknown target, a wrong input);
the CLI prints its message on one line and exits non-zero. Every other exception is a bug in tvmpipe.
"""


class TvmpipeError(Exception):
    """A failure caused by the input; the message names the file, node, op or input at fault."""
