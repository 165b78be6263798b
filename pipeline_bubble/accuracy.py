"""Predicted against measured: the replay's errors per configuration, with the closed-form theory's beside them.

A measured run (`Measured`) is the per-stage timelines of one configuration trained for some
blocks of batches back to back; its iteration time is the median over batches (after each
block's warm-up one) of the slowest stage's batch, and a stage's bubble the median of its time in blocking calls and guest steps,
as `timeline` counts it. A guest's cost is the median over batch pairs of (batch with guests /
the same configuration's batch without them at the same place of the same round) - 1.

The theory is `timeline`'s: (p-1)/(m+p-1) of the measured iteration per stage, and the same for
the stages' own measured compute times (`stage_bubble_fractions`), the most it can be given.
Acceptance (issue 29): iteration within 5%; a stage's bubble within 10%, or 2 ms when it is
under 20 ms; a guest's slowdown within 2 percentage points.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

from pipeline_bubble.profile import PipelineConfig
from pipeline_bubble.replay import Prediction
from pipeline_bubble.timeline import (
    GUEST,
    WAIT,
    StageTimeline,
    kept_batches,
    stage_bubble_fractions,
    theoretical_bubble_fraction,
)

ITERATION_TOLERANCE = 0.05
BUBBLE_TOLERANCE = 0.10
SMALL_BUBBLE_S = 0.020
SMALL_BUBBLE_TOLERANCE_S = 0.002
SLOWDOWN_TOLERANCE = 0.02


@dataclass
class Measured:
    """One configuration's measured timelines; `seeded`: its executor started from predicted windows;
    `guest_step_s`: each stage's guest step as its executor measured it."""

    config: PipelineConfig
    timelines: list[StageTimeline]
    seeded: bool = False
    guest_step_s: list[float | None] = field(default_factory=list)
    overruns: int = 0
    #: Batches trained back to back at a time; the first of each block is warm-up, left out.
    block: int = 0

    def kept(self) -> list[int]:
        """The batches measured: all but each block's warm-up one."""
        return kept_batches(min(len(t.batches) for t in self.timelines), self.block)

    def batch_times(self) -> list[float]:
        """Per batch after each warm-up, the slowest stage's time."""
        return [max(t.batches[i].span for t in self.timelines) for i in self.kept()]

    def iteration_s(self) -> float:
        return median(self.batch_times())

    def bubble_s(self) -> list[float]:
        return [
            median(t.batches[i].total(WAIT) + t.batches[i].total(GUEST) for i in self.kept()) for t in self.timelines
        ]

    def guest_s_by_batch(self) -> list[float]:
        """Guest seconds harvested in every batch, the first included, summed over stages."""
        return [sum(batches) for batches in zip(*([b.total(GUEST) for b in t.batches] for t in self.timelines))]

    def stage_compute_s(self) -> list[float]:
        """Each stage's forward and backward time per micro-batch (the closed form's stage times)."""
        return [t.micro_batch_compute() for t in self.timelines]


def paired_slowdown(harvested: list[float], baseline: list[float]) -> float:
    """Median over batch pairs of (harvested batch time / its baseline partner's) - 1.

    Trained batch by batch in turn, each pair saw nearly the same host load; the median of
    per-pair ratios shrugs off the load spikes of a shared machine that swamp a ratio of medians.
    """
    return median(h / b for h, b in zip(harvested, baseline)) - 1.0


def _quartiles(values: list[float]) -> list[float]:
    ordered = sorted(values)
    return [ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]]


def _bubble_ok(predicted: float, measured: float) -> bool:
    error = abs(predicted - measured)
    if measured < SMALL_BUBBLE_S:
        return error <= SMALL_BUBBLE_TOLERANCE_S
    return error <= BUBBLE_TOLERANCE * measured


def compare(prediction: Prediction, measured: Measured, baseline: Measured | None = None) -> dict[str, Any]:
    """One row: the prediction of `measured`'s configuration against it, the theory's errors beside;
    for a configuration with guests, `baseline` is the same configuration measured without them."""
    config = measured.config
    guests = config.guest_step_s is not None and prediction.guest_iteration_s is not None
    predicted_iteration = prediction.guest_iteration_s if guests else prediction.iteration_s
    predicted_bubbles = prediction.guest_bubble_s if guests else prediction.bubble_s
    iteration = measured.iteration_s()
    bubbles = measured.bubble_s()
    theory = theoretical_bubble_fraction(config.stages, config.micro_batches)
    compute = measured.stage_compute_s()
    theory_stages = stage_bubble_fractions(compute, config.micro_batches) if all(compute) else [theory] * config.stages
    row: dict[str, Any] = {
        "config": config.to_dict(),
        "label": config.label,
        "seeded": measured.seeded,
        # the measurement's own spread: where the host's load moves batch times by more than the
        # tolerance, the error says more about the host than about the prediction
        "iteration_s": {"predicted": predicted_iteration, "measured": iteration, "measured_quartiles": _quartiles(measured.batch_times())},
        "iteration_error": predicted_iteration / iteration - 1.0,
        "bubble_s": {"predicted": predicted_bubbles, "measured": bubbles},
        "bubble_error_s": [p - m for p, m in zip(predicted_bubbles, bubbles)],
        "bubble_ok": [_bubble_ok(p, m) for p, m in zip(predicted_bubbles, bubbles)],
        "theory_bubble_error_s": {
            "uniform": [theory * iteration - m for m in bubbles],
            "measured_stages": [f * iteration - m for f, m in zip(theory_stages, bubbles)],
        },
        "theory_bubble_ok": {
            "uniform": [_bubble_ok(theory * iteration, m) for m in bubbles],
            "measured_stages": [_bubble_ok(f * iteration, m) for f, m in zip(theory_stages, bubbles)],
        },
        "windows": len(prediction.typical.windows),
    }
    row["iteration_ok"] = abs(row["iteration_error"]) <= ITERATION_TOLERANCE
    if config.guest_step_s is not None and baseline is not None:
        measured_slowdown = paired_slowdown(measured.batch_times(), baseline.batch_times())
        guest_by_batch = measured.guest_s_by_batch()
        row["guest"] = {
            "step_s": {"admitted": config.guest_step_s, "measured": [s for s in measured.guest_step_s if s]},
            "slowdown": {"predicted": prediction.slowdown, "measured": measured_slowdown},
            "slowdown_error": (prediction.slowdown or 0.0) - measured_slowdown,
            "guest_s_per_iteration": {
                "predicted": sum(prediction.guest_s or []),
                "measured": median(guest_by_batch[i] for i in measured.kept()),
            },
            "first_batches_guest_s": guest_by_batch[:3],
            "overruns": measured.overruns,
        }
        row["guest"]["slowdown_ok"] = abs(row["guest"]["slowdown_error"]) <= SLOWDOWN_TOLERANCE
    return row


def summarize_errors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst of each error over the rows, the replay's and the theory's, and what passed."""

    def stats(values: list[float]) -> dict[str, float]:
        values = [abs(v) for v in values]
        return {"median": median(values), "worst": max(values)} if values else {}

    bubbles = [e for r in rows for e in r["bubble_error_s"]]
    slowdowns = [r["guest"]["slowdown_error"] for r in rows if "guest" in r]
    spreads = [(r["iteration_s"]["measured_quartiles"][1] - r["iteration_s"]["measured_quartiles"][0]) / r["iteration_s"]["measured"] for r in rows]
    return {
        "configurations": len(rows),
        "iteration_error": stats([r["iteration_error"] for r in rows]),
        #: The measured batch times' interquartile range over their median: the measurement's own noise.
        "measured_iteration_spread": stats(spreads),
        "bubble_error_s": stats(bubbles),
        "theory_bubble_error_s": {
            kind: stats([e for r in rows for e in r["theory_bubble_error_s"][kind]]) for kind in ("uniform", "measured_stages")
        },
        "slowdown_error": stats(slowdowns),
        "passed": {
            "iteration": sum(r["iteration_ok"] for r in rows),
            "bubble": sum(all(r["bubble_ok"]) for r in rows),
            "theory_bubble_uniform": sum(all(r["theory_bubble_ok"]["uniform"]) for r in rows),
            "theory_bubble_measured_stages": sum(all(r["theory_bubble_ok"]["measured_stages"]) for r in rows),
            "slowdown": sum(r["guest"]["slowdown_ok"] for r in rows if "guest" in r),
            "of_slowdown": len(slowdowns),
        },
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A table of predicted against measured, one line per configuration (milliseconds)."""
    lines = [
        f"{'configuration':34s} {'iteration ms':>22s} {'bubble per stage ms (pred/meas)':>36s} {'theory err ms':>14s} {'guest slowdown':>16s}",
    ]
    for r in rows:
        it = r["iteration_s"]
        bubbles = " ".join(f"{p * 1e3:.1f}/{m * 1e3:.1f}" for p, m in zip(r["bubble_s"]["predicted"], r["bubble_s"]["measured"]))
        theory = max(abs(e) for e in r["theory_bubble_error_s"]["measured_stages"]) * 1e3
        guest = ""
        if "guest" in r:
            s = r["guest"]["slowdown"]
            guest = f"{s['predicted']:+.1%}/{s['measured']:+.1%}"
        label = r["label"] + (" seeded" if r["seeded"] else "")
        lines.append(
            f"{label:34s} {it['predicted'] * 1e3:7.1f} {it['measured'] * 1e3:7.1f} {r['iteration_error']:+6.1%} "
            f"{bubbles:>36s} {theory:14.1f} {guest:>16s}"
        )
    return "\n".join(lines)
