"""Environment variables a sweep sets for itself, put back as they were when it returns.

Tune and its integrations read some settings only from `os.environ` (Tune's save period, W&B's
offline mode). A sweep sets them for as long as it runs, and a later plain Tune run, or any other
code in the same process (a notebook, a test), sees the environment the user left, not the
sweep's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set `values` in `os.environ` for the block; when it ends, however it ends, each of them
    holds what it held before (or is unset again)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
