"""Figures that the project draws into files (the sweep's curves, coordinate checks, simulation
results, pipeline Gantt charts), without pyplot.

pyplot picks a backend for the whole process, so drawing a PNG through it meant switching the
process to Agg: a notebook that called `hpo.run` or `coord_check` lost its inline plots. It also
keeps every figure until it is closed. A bare `Figure` is drawn by Agg when saved as a PNG,
whatever backend the process has, and is freed with its last reference.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

#: What drawing a figure into a PNG imports: about a second of a 2-core machine.
MODULES = ("matplotlib.figure", "matplotlib.collections", "matplotlib.backends.backend_agg")


def import_meanwhile() -> None:
    """Start importing `MODULES` in a thread, for a figure drawn later while the caller waits now
    on other work (a sweep's driver on its trials). The thread is not a daemon, so a process that
    ends early waits for the import instead of finalising under it."""
    threading.Thread(target=lambda: [importlib.import_module(name) for name in MODULES],
                     name="hpo-import-figures").start()


def subplots(*, figsize: tuple[float, float], **layout: Any) -> tuple[Any, Any]:
    """A new figure and its axes, as `matplotlib.pyplot.subplots` lays them out (`layout`: its
    nrows, ncols, sharey, squeeze...)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    return figure, figure.subplots(**layout)
