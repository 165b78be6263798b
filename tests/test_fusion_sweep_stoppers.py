"""What ends a fused member ends it as it would end the same configuration unfused: a Tune
`Stopper` or stop function is asked about each member's own results, a scheduler timed by Tune's
own counters (MedianStoppingRule's default `time_total_s`) reads them in each member's result, and
no group trains past the sweep's `max_iterations`, whatever the `stop` given."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
from ray import tune
from ray.tune.schedulers import MedianStoppingRule, TrialScheduler
from ray.tune.stopper import Stopper

import hpo
from examples.mlp_digits import workload as digits
from hpo.engines.fused.members import MemberBook, member_ids
from hpo.engines.fused.scheduler import GroupScheduler
from hpo.engines.stop_thresholds import split_stop


def group_result(members: list[str], losses: list[float], iteration: int, **tune_counters) -> dict:
    """A group trial's result as Tune hands it to the scheduler."""
    results = [{"member_id": m, "val_loss": loss, "training_iteration": iteration} for m, loss in zip(members, losses)]
    return {"val_loss": min(losses), "member_results": json.dumps(results), "training_iteration": iteration, **tune_counters}


def one_group(tmp_path, scheduler: GroupScheduler, size: int) -> tuple[SimpleNamespace, list[str]]:
    trial = SimpleNamespace(trial_id="g1", config={"members": [{"lr": 10.0**-i} for i in range(size)]})
    scheduler.on_trial_add(None, trial)
    return trial, member_ids("g1", size)


def test_a_scheduler_timed_by_tunes_counters_decides_for_each_member(tmp_path):
    """MedianStoppingRule times trials by `time_total_s` unless told otherwise; a member's result
    lacked it, so the rule skipped every member and stopped none (the same sweep unfused stops)."""
    median = MedianStoppingRule(metric="val_loss", mode="min", grace_period=0, min_samples_required=1)
    scheduler = GroupScheduler(median, MemberBook(tmp_path, "digits"), max_iterations=4)
    trial, (good, bad) = one_group(tmp_path, scheduler, 2)
    decision = scheduler.on_trial_result(None, trial, group_result([good, bad], [0.5, 2.0], 1, time_total_s=1.5))
    assert scheduler.book.members[bad].ended == "early_stopped", "worse than the median of the others at t=1.5"
    assert scheduler.book.members[good].live and decision == TrialScheduler.CONTINUE
    assert scheduler.book.members[good].last_result["time_total_s"] == 1.5


class BelowAtSecond(Stopper):
    """Stops a trial whose loss at its second result is above 1 (stateful: counts each trial's results)."""

    def __init__(self):
        self.seen: dict[str, int] = {}
        self.asked: list[str] = []

    def __call__(self, trial_id, result):
        self.asked.append(trial_id)
        self.seen[trial_id] = self.seen.get(trial_id, 0) + 1
        return self.seen[trial_id] == 2 and result["val_loss"] > 1.0

    def stop_all(self):
        return False


def test_a_stopper_is_asked_about_each_members_own_result_not_the_groups_best(tmp_path):
    stopper = BelowAtSecond()
    group_stop, thresholds, member_stop = split_stop(stopper)
    assert thresholds == {} and member_stop is stopper
    assert not group_stop("g1", {"val_loss": 5.0, "training_iteration": 2}), "the group's trial is no trial of the user's"
    scheduler = GroupScheduler(None, MemberBook(tmp_path, "digits"), max_iterations=4, stopper=member_stop)
    trial, (good, bad) = one_group(tmp_path, scheduler, 2)
    for iteration in (1, 2):
        scheduler.on_trial_result(None, trial, group_result([good, bad], [0.5, 2.0], iteration))
    assert scheduler.book.members[bad].ended == "early_stopped" and scheduler.book.members[good].live
    assert sorted(set(stopper.asked)) == sorted([good, bad])
    assert split_stop(lambda trial_id, result: False)[2] is not None, "a stop function too"


def sweep(tmp_path, name: str, fusion, stop) -> dict:
    result = hpo.run(
        digits, config={"lr": tune.grid_search([1e-4, 1e-3, 1e-2, 1e-1]), "width": 16, "seed": 3},
        metric="val_loss", mode="min", stop=stop, storage_path=str(tmp_path), name=name, fusion=fusion, verbose=0,
    )
    rows = pd.read_csv(result.paths["results"])
    return {row["config/lr"]: (row["training_iteration"], row["status"]) for _, row in rows.iterrows()}


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_stop_function_ends_each_fused_member_where_it_ends_the_configuration_unfused(tmp_path):
    """With a stop function and no iteration count the sweep trains to hpo's default
    `max_iterations`; the fused groups trained on past it, judged by their best member's loss, until
    the function stopped the whole group (976 iterations)."""

    def above_one_at_two(trial_id, result):
        return result["training_iteration"] >= 2 and result["val_loss"] > 1.0

    plain = sweep(tmp_path, "plain", None, above_one_at_two)
    fused = sweep(tmp_path, "fused", {"max_members": 4}, above_one_at_two)
    assert fused == plain
    assert {status for _, status in plain.values()} == {"early_stopped", "completed"}, plain


class EndTheSweepAfter(Stopper):
    """Stops no trial; ends the whole sweep once `results` results were reported (as a time budget
    or an experiment-wide plateau does)."""

    def __init__(self, results: int):
        self.results, self.seen = results, 0

    def __call__(self, trial_id, result):
        self.seen += 1
        return False

    def stop_all(self):
        return self.seen >= self.results


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_members_a_sweep_wide_stop_cuts_short_are_early_stopped_as_unfused_trials_are(tmp_path):
    """Tune ends every trial at a time budget or a stopper's `stop_all` without telling the
    scheduler; the fused members of the groups it stopped stayed `running`, so the sweep had no
    best configuration and `hpo results --rebuild` showed them running for ever."""
    result = hpo.run(
        digits, config={"lr": tune.grid_search([1e-3, 1e-2, 1e-1, 3e-1]), "width": 16, "seed": 3},
        metric="val_loss", mode="min", stop=EndTheSweepAfter(results=2), storage_path=str(tmp_path), name="cut",
        fusion={"max_members": 2}, verbose=0,
    )
    rows = pd.read_csv(result.paths["results"])
    reported = rows[rows["training_iteration"] > 0]
    assert len(reported) >= 2 and set(reported["status"]) == {"early_stopped"}, rows
    assert "running" not in set(rows["status"]), rows
    assert result.best_config["lr"] in set(reported["config/lr"])
    statuses = {p.parent.name: json.loads(p.read_text())["status"] for p in (tmp_path / "cut" / "members").glob("*/status.json")}
    assert set(statuses.values()) == {"early_stopped"} and len(statuses) == len(rows), "a resume or --rebuild sees them ended"
