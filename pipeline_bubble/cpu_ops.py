"""Where DeepSpeed's JIT-compiled CPU op lives: in the Python environment, not in the user's shared cache.

A DeepSpeed process builds (or re-checks) its shared-memory comm op on its first `init_distributed`,
through torch's JIT extension loader, holding a plain lock file in the op's build folder for the
whole build. torch's default folder, `~/.cache/torch_extensions/py311_cpu`, is shared by every
checkout and environment of the user, keyed by Python version alone. So a build killed while it
holds the lock (a session that ends mid-build, a killed test) leaves a lock that every later
process of every checkout waits on forever: torch's `FileBaton.wait` has no time limit, and a CI
run spent its whole 90 minutes in `make setup` on one. The folder also mixes ops built against
different torch releases.

Each environment builds into its own `<sys.prefix>/torch_extensions` instead (`TORCH_EXTENSIONS_DIR`,
unless the user set it): a fresh clone's `make setup` cannot meet another checkout's lock, and
`make clean` removes the ops with the torch they were built for. A lock older than any build
(`STALE_LOCK_S`) is a killed build's: it is removed with a warning naming it, rather than waited on.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

#: The environment variable torch's extension loader (and so DeepSpeed's op builder) builds under.
EXTENSIONS_DIR_VAR = "TORCH_EXTENSIONS_DIR"
#: Longer than any build of DeepSpeed's CPU op: 40-60 s on 2 cores, 9 minutes seen on an overloaded box.
STALE_LOCK_S = 30 * 60


def environment_extensions_dir() -> Path:
    """The folder this Python environment's JIT-compiled extensions belong in."""
    return Path(sys.prefix) / "torch_extensions"


def use_environment_extensions_dir(stale_after_s: float = STALE_LOCK_S) -> Path:
    """Point torch's extension builds at this environment (a folder the user chose wins); clear stale locks.

    Set in the environment, so the spawned pipeline ranks and Ray workers started from here inherit it.
    """
    root = Path(os.environ.setdefault(EXTENSIONS_DIR_VAR, str(environment_extensions_dir())))
    clear_stale_locks(root, stale_after_s)
    return root


def clear_stale_locks(root: Path, older_than_s: float) -> list[Path]:
    """Remove the build locks under `root` older than `older_than_s` (a killed build's), warning for each."""
    removed = []
    now = time.time()
    for lock in sorted(root.glob("*/lock")):
        try:
            age_s = now - lock.stat().st_mtime
            if age_s < older_than_s:
                continue
            lock.unlink()
        except FileNotFoundError:  # its build just finished
            continue
        warnings.warn(f"removed {lock}, a build lock {age_s / 60:.0f} min old left by a killed build", stacklevel=2)
        removed.append(lock)
    return removed


def build_pipeline_op() -> Path:
    """Build the one CPU op every DeepSpeed pipeline loads, so no pipeline's first step pays for it.

    `make setup-bubbles` (which `make test` runs) runs this once per environment, before anything
    in it runs a pipeline, so any lock found then is a killed setup's, whatever its age. Without
    it, the first pipeline-bubble run builds the op.
    """
    root = use_environment_extensions_dir(stale_after_s=0)
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    ShareMemCommBuilder().load(verbose=False)
    return root
