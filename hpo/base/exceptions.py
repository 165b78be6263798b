"""One line for an exception raised by the user's code: what every command prints instead of a traceback."""

from __future__ import annotations

import traceback


def describe_exception(exc: BaseException) -> str:
    """`Type: message (file:line)` of an exception raised by user code, at its innermost frame."""
    if isinstance(exc, SyntaxError):
        where = f" ({exc.filename}:{exc.lineno})"
        message = exc.msg
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"
