"""Gantt charts of pipeline stage timelines, bubbles shaded (matplotlib, drawn by Agg): all stages of one
batch (`plot_gantt`), or one stage predicted above measured (`plot_stage_comparison`)."""

from __future__ import annotations

from pathlib import Path

from hpo.base.figures import subplots

from pipeline_bubble.timeline import COMPUTE, GUEST, WAIT, StageTimeline, theoretical_bubble_fraction

_COLOURS = {"ForwardPass": "#4c72b0", "BackwardPass": "#55a868", "OptimizerStep": "#8172b2"}
_OTHER_COMPUTE = "#937860"
_BUBBLE = "#d9d9d9"
_GUEST = "#dd8452"


def plot_gantt(timelines: list[StageTimeline], path: str | Path, *, batch: int = -1, title: str = "") -> None:
    """One row per stage for one batch (default: the last): compute coloured, waits shaded grey,
    guest steps orange; the title gives the measured and theoretical bubble fractions."""
    timelines = sorted(timelines, key=lambda t: t.stage)
    records = [t.batches[batch] for t in timelines]
    origin = min(r.start for r in records)
    fig, ax = subplots(figsize=(11, 0.7 * len(timelines) + 1.6))
    for t, record in zip(timelines, records):
        _draw_batch(ax, t.stages - 1 - t.stage, record, origin)
    first = timelines[0]
    measured = sum(t.bubble_fraction() for t in timelines) / len(timelines)
    theory = theoretical_bubble_fraction(first.stages, first.micro_batches)
    ax.set_yticks(range(first.stages), [f"stage {first.stages - 1 - s}" for s in range(first.stages)])
    ax.set_xlabel(f"ms since batch start ({first.device})")
    ax.set_title(
        f"{title} p={first.stages} m={first.micro_batches}: bubble measured {measured:.1%} "
        f"vs theory (p-1)/(m+p-1) = {theory:.1%}".strip()
    )
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_stage_comparison(
    predicted: StageTimeline, measured: StageTimeline | None, path: str | Path, *, title: str = "", batch: int | None = None
) -> None:
    """One stage's predicted batch above its measured one (default: the measured batch of median
    length after the warm-up), each from its own start: compute coloured, waits grey, guest steps orange."""
    rows = [("predicted", predicted.batches[0])]
    if measured is not None and measured.batches:
        if batch is None:
            candidates = measured.measured()
            batch = sorted(candidates, key=lambda b: b.span)[len(candidates) // 2].index
        rows.append(("measured", measured.batches[batch]))
    fig, ax = subplots(figsize=(11, 0.7 * len(rows) + 1.6))
    for row, (_, record) in enumerate(reversed(rows)):
        _draw_batch(ax, row, record, record.start)
    ax.set_yticks(range(len(rows)), [f"{name}\n{record.span * 1e3:.1f} ms" for name, record in reversed(rows)])
    ax.set_xlabel("ms since the stage's batch start")
    spans = ", ".join(f"{name} bubble {(r.total(WAIT) + r.total(GUEST)) * 1e3:.1f} ms" for name, r in rows)
    ax.set_title(f"{title} stage {predicted.stage}: {spans}".strip(), fontsize=10)
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _draw_batch(ax, row: int, record, origin: float) -> None:
    """One batch of one stage as a bar row: compute by instruction, waits hatched grey, guest steps orange."""
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
        if interval.collective_start is not None and interval.collective_end is not None:
            # inside the step, hatched: where the stage that came first waits for the others
            ax.broken_barh(
                [((interval.collective_start - origin) * 1e3, (interval.collective_end - interval.collective_start) * 1e3)],
                (row - 0.4, 0.8),
                facecolors="none",
                edgecolors="black",
                linewidth=0,
                hatch="xx",
            )


def _legend(ax) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=n) for n, c in _COLOURS.items()]
    handles += [
        Patch(facecolor=_OTHER_COMPUTE, label=f"other {COMPUTE}"),
        Patch(facecolor=_BUBBLE, hatch="//", label="bubble (wait)"),
        Patch(facecolor=_COLOURS["OptimizerStep"], hatch="xx", label="gradient-norm all-reduce"),
        Patch(facecolor=_GUEST, label=f"{GUEST} step"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=7, fontsize=8)
