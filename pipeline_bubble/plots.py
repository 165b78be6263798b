"""Gantt charts of pipeline stage timelines, bubbles shaded (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

from pipeline_bubble.timeline import COMPUTE, GUEST, WAIT, StageTimeline, theoretical_bubble_fraction

_COLOURS = {"ForwardPass": "#4c72b0", "BackwardPass": "#55a868", "OptimizerStep": "#8172b2"}
_OTHER_COMPUTE = "#937860"
_BUBBLE = "#d9d9d9"
_GUEST = "#dd8452"


def plot_gantt(timelines: list[StageTimeline], path: str | Path, *, batch: int = -1, title: str = "") -> None:
    """One row per stage for one batch (default: the last): compute coloured, waits shaded grey,
    guest steps orange; the title gives the measured and theoretical bubble fractions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    timelines = sorted(timelines, key=lambda t: t.stage)
    records = [t.batches[batch] for t in timelines]
    origin = min(r.start for r in records)
    fig, ax = plt.subplots(figsize=(11, 0.7 * len(timelines) + 1.6))
    for t, record in zip(timelines, records):
        row = t.stages - 1 - t.stage
        ax.broken_barh([(0, (record.end - origin) * 1e3)], (row - 0.4, 0.8), facecolors="white", edgecolors="none")
        for interval in record.intervals:
            if interval.category == WAIT:
                colour, hatch = _BUBBLE, "//"
            elif interval.category == GUEST:
                colour, hatch = _GUEST, None
            else:
                colour, hatch = _COLOURS.get(interval.name, _OTHER_COMPUTE), None
            ax.broken_barh(
                [((interval.start - origin) * 1e3, interval.duration * 1e3)],
                (row - 0.4, 0.8),
                facecolors=colour,
                edgecolors="none",
                hatch=hatch,
            )
    first = timelines[0]
    measured = sum(t.bubble_fraction() for t in timelines) / len(timelines)
    theory = theoretical_bubble_fraction(first.stages, first.micro_batches)
    ax.set_yticks(range(first.stages), [f"stage {first.stages - 1 - s}" for s in range(first.stages)])
    ax.set_xlabel(f"ms since batch start ({first.device})")
    ax.set_title(
        f"{title} p={first.stages} m={first.micro_batches}: bubble measured {measured:.1%} "
        f"vs theory (p-1)/(m+p-1) = {theory:.1%}".strip()
    )
    handles = [Patch(facecolor=c, label=n) for n, c in _COLOURS.items()]
    handles += [
        Patch(facecolor=_OTHER_COMPUTE, label=f"other {COMPUTE}"),
        Patch(facecolor=_BUBBLE, hatch="//", label="bubble (wait)"),
        Patch(facecolor=_GUEST, label=f"{GUEST} step"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=6, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
