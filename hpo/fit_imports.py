"""What a sweep's driver imports anyway, imported while Ray starts.

`ray.init` spends most of its seconds waiting for the processes it starts. After it, on the
sweep's own clock, the driver imports two heavy things no trial needs:
- the logger integrations Ray Tune's usage telemetry imports whenever a run is given callbacks
  (every hpo sweep is: progress, results files, controller), whether or not they are used:
  `ray.air.integrations.mlflow` and `.wandb` import MLflow and W&B at module level where they
  are installed (the `logging` extra);
- matplotlib, for the curves every sweep writes at its end (`hpo.results`).
Importing them in a thread during Ray's start moves that work off the sweep's clock. The modules
are public ones the run imports in any case, so nothing is loaded that the run would not load.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: Imported during Ray's start, in this order. Tune's telemetry list (`ray.air._internal.usage`)
#: first, then matplotlib without pyplot: pyplot would pick a GUI backend from a worker thread.
FIT_IMPORTS = (
    "ray.air.integrations.mlflow",
    "ray.air.integrations.wandb",
    "ray.air.integrations.comet",
    "ray.tune.logger.aim",
    "matplotlib",
    "matplotlib.figure",
)


@contextmanager
def importing_in_background(modules: Sequence[str] = FIT_IMPORTS) -> Iterator[None]:
    """Import `modules` in a thread while the block runs; the block's end waits for them, so
    nothing is still importing once the sweep starts."""
    thread = threading.Thread(target=import_modules, args=(tuple(modules),), name="hpo-fit-imports", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def import_modules(modules: Sequence[str]) -> None:
    """Import each of `modules` that imports; a missing optional package is no error here."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  one that fails here fails again, with its error, where the run imports it
            continue
