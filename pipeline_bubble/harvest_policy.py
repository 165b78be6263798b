"""The bubble executor's rules in numbers: which waits a guest may fill, and how much of a window it plans.

They live apart from `executor` (which needs torch) because the replayer (`replay`) predicts what
the executor will do without torch in its process: both read the same settings from here.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline_bubble.train_schedule import LOSS_BROADCAST

#: Share of an open-loop predicted window a quantum may use (the rest absorbs misprediction).
SAFETY = 0.9
#: Quantile of a signalled slot's recent exact windows planned (the executor's "closed loop").
WINDOW_QUANTILE = 0.75
#: Exact windows per slot that plan is taken from.
WINDOW_HISTORY = 8
#: Open loop: observation batches a window prediction is the minimum of, and one batch in how many re-observes.
HISTORY = 2
OBSERVE_EVERY = 8
#: Waits a guest may fill when the other side sends no arrival signal (another host): the
#: receiving side of each exchange only. A gloo exchange completes when both sides have
#: arrived, so a quantum on either side delays the other; giving every exchange one owner (the
#: side that waits for data) keeps two guests from stretching the same exchange from both ends.
#: With signals every wait is fillable: the side that arrives first fills it, the other finds
#: it ready. The loss broadcast is filled on its source, the last stage, which waits there for the others.
HARVESTABLE = ("RecvActivation", "RecvGrad")


def is_harvestable(name: str, stage: int, stages: int) -> bool:
    """Whether a guest may fill the wait of instruction `name` on `stage` without signals (see `HARVESTABLE`)."""
    return name in HARVESTABLE or (name == LOSS_BROADCAST and stage == stages - 1)


def quantile(values: Iterable[float], q: float) -> float:
    """The executor's quantile: the value at rank int(q * n) of the sorted values (no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
