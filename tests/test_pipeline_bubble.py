"""Bubble harvesting on a real 2-process DeepSpeed pipeline (CPU, gloo), plus executor unit specs.

The module fixture launches one job: each rank trains the reference pipeline twice in turn,
without and with tuning trials in its bubbles: four digits-MLP configs handed to the job with
`run_guests_in_bubbles`, so each stage trains two of them as one `fusion.FusedTrainer` group;
the guests are evicted part-way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hpo.examples.mlp_digits import workload as digits

from pipeline_bubble import deepspeed_adapter
from benchmarks.bubble_ab import ABSpec, run_rank, synthetic_guest
from pipeline_bubble.executor import STARVED_BATCHES, BubbleExecutor
from pipeline_bubble.api import _stage_guest
from pipeline_bubble.guests import GuestGroup
from pipeline_bubble.launch import launch
from pipeline_bubble.plots import plot_gantt
from pipeline_bubble.timeline import GUEST, WAIT, StageTimeline, load_timelines, save_timelines
from pipeline_bubble.timeline import stage_bubble_fractions, theoretical_bubble_fraction

BATCHES = 9
EVICT_AFTER = 7
SWEEP = [{"lr": lr, "width": 32, "seed": i} for i, lr in enumerate((1e-3, 2e-3, 3e-3, 5e-3))]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    checkpoints = tmp_path_factory.mktemp("guest_checkpoints")
    spec = ABSpec(
        stages=2,
        micro_batches=4,
        micro_batch_size=64,
        width=1024,
        batches=BATCHES,
        sweep_configs=SWEEP,
        checkpoint_dir=str(checkpoints),
        evict_after=EVICT_AFTER,
    )
    results = launch(run_rank, 2, spec, timeout_s=240, log_dir=tmp_path_factory.mktemp("logs"))
    return {"results": results, "checkpoints": checkpoints}


def _timelines(job, run: str) -> list[StageTimeline]:
    return [StageTimeline.from_dict(r["timelines"][run]) for r in job["results"]]


@pytest.mark.slow
def test_every_stage_has_measured_bubble_windows(job, tmp_path):
    for timeline in _timelines(job, "baseline"):
        assert len(timeline.batches) == BATCHES
        waits = [i for b in timeline.measured() for i in b.intervals if i.category == WAIT]
        assert waits and sum(i.duration for i in waits) > 0, f"stage {timeline.stage} recorded no waits"
        assert 0 < timeline.bubble_fraction() < 1
    save_timelines(_timelines(job, "harvested"), tmp_path / "timeline.json")
    assert [t.stage for t in load_timelines(tmp_path / "timeline.json")] == [0, 1]
    summary = json.loads((tmp_path / "timeline.json").read_text())["summary"]
    assert summary["theory_fraction"] == pytest.approx(0.2)
    assert 0 < summary["theory_fraction_measured_stages"] < 1
    plot_gantt(_timelines(job, "harvested"), tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 0


@pytest.mark.slow
def test_harvested_steps_trained_the_fused_groups(job):
    steps = [r["harvest"]["steps"] for r in job["results"]]
    assert sum(steps) > 0, f"no guest step ran in any bubble: {[r['harvest'] for r in job['results']]}"
    for result in job["results"]:
        losses = result["guest_losses"]  # 8 profiling steps at attach, then the harvested ones
        if result["harvest"]["steps"] >= 4:
            first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
            assert last < first, f"stage {result['stage']} guest loss did not decrease: {first:.3f} -> {last:.3f}"
    assert max(steps) >= 4, f"too few harvested steps to judge training: {steps}"
    guest_spans = [i for t in _timelines(job, "harvested") for b in t.batches for i in b.intervals if i.category == GUEST]
    assert len(guest_spans) == sum(steps)


@pytest.mark.slow
def test_stages_learn_their_windows_from_their_neighbours_arrival_signals(job):
    for result in job["results"]:
        timeline = StageTimeline.from_dict(result["timelines"]["harvested"])
        filled = {i.slot for b in timeline.batches for i in b.intervals if i.category == GUEST}
        assert filled, f"stage {result['stage']} harvested nothing"
        assert filled <= set(result["harvest"]["signalled_slots"]), "a harvested slot had no arrival signal"


@pytest.mark.slow
def test_each_trial_is_reported_with_its_own_metrics(job):
    rows = sorted((row for r in job["results"] for row in r["trials"]), key=lambda row: row["trial_id"])
    assert [row["trial_id"] for row in rows] == [0, 1, 2, 3], "stage s trains configs[s::2]"
    assert [row["config"]["lr"] for row in rows] == [c["lr"] for c in SWEEP]
    assert all(row["steps"] > 0 and 0 < row["val_loss"] < 10 for row in rows)


@pytest.mark.slow
def test_main_job_is_bit_identical_with_and_without_harvesting(job):
    for result in job["results"]:
        assert result["losses"]["baseline"] == result["losses"]["harvested"], f"stage {result['stage']} losses differ"
        assert result["digests"]["baseline"] == result["digests"]["harvested"], "parameters differ"
        assert result["rng_equal"], "the guest advanced the main job's global RNG"


@pytest.mark.slow
def test_evicted_guest_stops_and_resumes_from_its_checkpoint(job):
    for result in job["results"]:
        late = [
            i
            for b in StageTimeline.from_dict(result["timelines"]["harvested"]).batches[EVICT_AFTER:]
            for i in b.intervals
            if i.category == GUEST
        ]
        assert not late, "guest steps ran after eviction"
        path = Path(job["checkpoints"]) / f"stage{result['stage']}.pt"
        saved = torch.load(path, weights_only=False)
        assert saved["harvested_steps"] == result["harvest"]["steps"]
        stage = result["stage"]
        resumed = _stage_guest(digits, SWEEP[stage::2], list(range(4))[stage::2], torch.device("cpu"))
        resumed.load_state_dict(saved["guest"])
        assert resumed.steps == len(result["guest_losses"])  # profiling steps + harvested steps
        assert resumed.step() < result["guest_losses"][0]


# ---- executor specs, no processes, on a fake clock ------------------------------------------------
class _Clock:
    """Time that moves only when a guest step runs or a spec lets it pass: no sleeps, exact windows."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _TimedGuest:
    """A guest whose every step takes exactly `seconds` on `clock`."""

    samples_per_step = 1
    memory_bytes = 1000

    def __init__(self, clock: _Clock, seconds: float):
        self.clock, self.seconds, self.steps = clock, seconds, 0

    def step(self) -> float:
        self.clock.advance(self.seconds)
        self.steps += 1
        return 1.0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def _executor(step_s: float, **options) -> tuple[BubbleExecutor, _Clock]:
    """A started executor whose guest steps take `step_s`, on a fresh fake clock."""
    clock = _Clock()
    host = options.pop("host", None)
    executor = BubbleExecutor(_TimedGuest(clock, step_s), profile_steps=2, clock=clock, **options)
    executor.start("cpu", host=host)
    return executor, clock


class _Recorder:
    def __init__(self, clock: _Clock):
        self.clock, self.spans = clock, []

    def mark(self):
        return self.clock()

    def record(self, name, category, start, end, slot):
        self.spans.append((start, end))


def _observed(executor: BubbleExecutor, slot: int, wait_s: float) -> None:
    """One observation batch in which `slot` blocked `wait_s` (another slot sets the floor to 0)."""
    if executor._batches == 0:
        executor.begin_batch()  # the warm-up batch, never used for predictions
    executor.begin_batch()
    executor.observe(slot + 1, 0.0, 0.0)
    executor.observe(slot, 0.0, wait_s)


def test_executor_runs_only_the_whole_steps_that_fit_the_safety_share_of_the_window():
    executor, clock = _executor(0.01, history=1)
    _observed(executor, slot=3, wait_s=0.035)
    recorder = _Recorder(clock)
    assert executor.harvest(3, recorder) == 0.0, "an observation batch must run no guest"
    executor.begin_batch()
    used = executor.harvest(3, recorder)
    # 0.9 x 35 ms = 31.5 ms of budget: three 10 ms steps fit, a fourth would end at 40 ms
    assert len(recorder.spans) == 3
    assert used == pytest.approx(0.03)
    assert executor.harvest(7, recorder) == 0.0, "a slot never observed has no predicted window"


def test_executor_shrinks_a_slots_quantum_after_an_overrun():
    executor, _ = _executor(0.002, history=1)
    _observed(executor, slot=0, wait_s=0.05)
    executor.begin_batch()
    executor.observe(0, harvested_s=0.045, blocked_s=0.0)  # the peer was already waiting
    assert executor.stats.overruns == 1
    assert executor._scale[0] == executor.backoff


def test_window_prediction_ignores_harvested_batches():
    executor, _ = _executor(0.001, observe_every=4, history=1)
    _observed(executor, slot=0, wait_s=0.02)
    executor.begin_batch()  # a harvested batch: its (longer) wait must not grow the window
    executor.observe(0, harvested_s=0.018, blocked_s=0.01)
    assert executor.predicted_window(0) == pytest.approx(0.02)


class _Arrival:
    """A neighbour that reaches the exchange `after_s` seconds from now on `clock`."""

    def __init__(self, clock: _Clock, after_s: float):
        self.clock, self.at = clock, clock() + after_s

    def arrived(self) -> bool:
        return self.clock() >= self.at

    def arrival_time(self) -> float | None:
        return self.at if self.arrived() else None


def _signalled(executor: BubbleExecutor, clock: _Clock, slot: int, window_s: float) -> float:
    """One batch in which the neighbour of `slot` arrived `window_s` after the stage got there."""
    executor.begin_batch()
    arrival = _Arrival(clock, window_s)
    used = executor.harvest(slot, _Recorder(clock), arrival)
    clock.advance(max(0.0, arrival.at - clock()))
    executor.observe(slot, used, 0.0, arrival=arrival)
    return used


def test_a_signalled_window_is_learnt_exactly_even_while_harvesting():
    executor, clock = _executor(0.002)
    executor.begin_batch()  # warm-up
    assert _signalled(executor, clock, slot=4, window_s=0.03) == 0.0, "no window known yet"
    assert executor.predicted_window(4, closed_loop=True) == pytest.approx(0.03)
    assert _signalled(executor, clock, slot=4, window_s=0.03) > 0.0  # harvested this time
    assert executor.stats.steps > 0
    assert executor.predicted_window(4, closed_loop=True) == pytest.approx(0.03)
    assert executor.signalled_slots == [4]


def test_a_signalled_slot_stops_its_guest_at_the_first_step_boundary_after_the_neighbour_arrives():
    step_s = 0.01
    executor, clock = _executor(step_s)
    executor.begin_batch()  # warm-up
    _signalled(executor, clock, slot=0, window_s=0.2)
    executor.begin_batch()
    used = executor.harvest(0, _Recorder(clock), _Arrival(clock, 0.045))  # planned 200 ms, the neighbour came at 45
    assert used == pytest.approx(0.05), "steps at 0, 10, .., 40 ms; the one at 50 ms must not start"


def test_a_seeded_executor_harvests_from_its_first_batch_and_an_unseeded_one_does_not():
    seeded, clock = _executor(0.01)
    seeded.seed_windows({2: 0.035, 5: 0.0})
    unseeded, other_clock = _executor(0.01)
    seeded.begin_batch()
    unseeded.begin_batch()
    assert seeded.harvest(2, _Recorder(clock), _Arrival(clock, 0.1)) == pytest.approx(0.03), "three 10 ms steps fit 35 ms"
    assert unseeded.harvest(2, _Recorder(other_clock), _Arrival(other_clock, 0.1)) == 0.0
    assert seeded.harvest(5, _Recorder(clock), _Arrival(clock, 0.1)) == 0.0, "a window of nothing is no seed"


def test_an_open_loop_slot_is_harvested_from_its_seed_until_it_is_observed():
    executor, clock = _executor(0.01, history=1, observe_every=4)
    executor.seed_windows({3: 0.025})
    executor.begin_batch()  # batch 0: no initial observation batches once seeded
    assert executor.harvest(3, _Recorder(clock)) == pytest.approx(0.02), "0.9 x 25 ms holds two 10 ms steps"
    for _ in range(4):
        executor.begin_batch()
    assert executor._observing, "every observe_every-th batch (here batch 4) still re-observes"
    executor.observe(3, 0.0, 0.045)
    executor.observe(4, 0.0, 0.0)
    assert executor.predicted_window(3) == pytest.approx(0.045), "the measurement replaces the seed"


def test_a_seeded_closed_loop_slot_learns_its_measured_window():
    executor, clock = _executor(0.002)
    executor.seed_windows({4: 0.01})
    assert _signalled(executor, clock, slot=4, window_s=0.03) > 0.0, "the warm-up batch is harvested from the seed"
    assert executor.predicted_window(4, closed_loop=True) == pytest.approx(0.01), "and not learnt from"
    _signalled(executor, clock, slot=4, window_s=0.03)
    assert executor.predicted_window(4, closed_loop=True) == pytest.approx(0.03)


def test_a_cpu_guest_waits_while_every_core_runs_the_job():
    class Host:
        free = False

        def core_free(self):
            return self.free

    host = Host()
    executor, clock = _executor(0.001, host=host)
    executor.begin_batch()  # warm-up
    _signalled(executor, clock, slot=0, window_s=0.02)
    executor.begin_batch()
    assert executor.harvest(0, _Recorder(clock), _Arrival(clock, 0.02)) == 0.0, "a step took a core from the job"
    assert executor.stats.no_core == 1
    host.free = True
    assert executor.harvest(0, _Recorder(clock), _Arrival(clock, 0.02)) > 0.0


def _rebusied_stage(profiled_s: float, step_s: float) -> tuple[BubbleExecutor, _Clock, _TimedGuest]:
    """A stage past its warm-up batch whose guest's steps took `profiled_s` while it was profiled
    (a busier host) and take `step_s` from then on."""
    clock = _Clock()
    guest = _TimedGuest(clock, profiled_s)
    executor = BubbleExecutor(guest, profile_steps=2, clock=clock)
    executor.start("cpu")
    guest.seconds = step_s
    executor.begin_batch()
    executor.end_batch()
    return executor, clock, guest


def _batch(executor: BubbleExecutor, clock: _Clock, window_s: float) -> None:
    """One whole batch whose one wait (slot 0, signalled) lasts `window_s`."""
    _signalled(executor, clock, slot=0, window_s=window_s)
    executor.end_batch()


def test_a_step_prediction_longer_than_every_window_is_measured_again_and_the_guest_fills_them():
    # As seen on a lending stage whose windows were at most ~6 ms: its group was profiled while
    # the host was busy, and a prediction of 10 ms a step never let it take another step.
    executor, clock, _ = _rebusied_stage(profiled_s=0.010, step_s=0.004)
    batches = 0
    while executor.stats.steps == 0:
        assert batches <= STARVED_BATCHES + 1, "a 4 ms step never went into the 6 ms windows"
        _batch(executor, clock, window_s=0.006)
        batches += 1
    assert executor.guest is not None and executor.refused is None
    assert executor.step_time_s == pytest.approx(0.004)


def test_a_guest_whose_step_fits_no_window_of_its_stage_leaves_it_unfinished_saying_why():
    executor, clock, guest = _rebusied_stage(profiled_s=0.010, step_s=0.010)
    closed: list[str | None] = []
    guest.close = closed.append  # a lending stage's group: None gives it back to the pool for another stage
    for _ in range(2 * STARVED_BATCHES + 1):  # the first batch learns the window
        _batch(executor, clock, window_s=0.006)
    assert executor.guest is None and closed == [None] and executor.failed is None
    assert executor.refused == (
        "its step (10.0 ms, measured twice) fitted none of this stage's bubble windows (the longest 6.0 ms) in 16 batches"
    )


#: The property below counts time in ticks of 2^-14 s (61 us), which the fake clock adds and
#: subtracts exactly: a step that fits a window does so by the numbers, not by a rounding.
TICK_S = 2.0**-14


@settings(max_examples=200, deadline=None)
@given(profiled=st.integers(1, 800), step=st.integers(1, 800), window=st.integers(0, 1000))
def test_a_ready_guest_on_a_stage_with_windows_either_trains_in_them_or_leaves_it(profiled, step, window):
    """Whatever its profile said, a guest never holds a stage without training: if its step fits
    the stage's windows it trains in them, else it is refused and leaves for another stage."""
    executor, clock, _ = _rebusied_stage(profiled * TICK_S, step * TICK_S)
    # learning the window, perhaps one step on the old prediction, then twice STARVED_BATCHES
    for _ in range(2 * STARVED_BATCHES + 2):
        if executor.guest is None:
            break
        _batch(executor, clock, window_s=window * TICK_S)
    if step <= window:
        assert executor.stats.steps > 0 and executor.refused is None
    else:
        assert executor.guest is None and executor.refused is not None


def test_guest_over_the_memory_cap_is_refused():
    executor, _ = _executor(0.001, memory_cap_bytes=10)
    assert executor.guest is None and "memory_cap_bytes" in executor.refused


def test_guest_step_leaves_the_global_rng_untouched():
    guest = synthetic_guest(0, torch.device("cpu"))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    for _ in range(3):
        guest.step()
    assert torch.equal(before, torch.get_rng_state())


def test_guest_group_checkpoint_round_trip():
    group = GuestGroup([synthetic_guest(0, torch.device("cpu")), synthetic_guest(1, torch.device("cpu"))])
    for _ in range(3):
        group.step()
    state = group.state_dict()
    fresh = GuestGroup([synthetic_guest(0, torch.device("cpu")), synthetic_guest(1, torch.device("cpu"))])
    fresh.load_state_dict(state)
    assert fresh.step() == group.step()


def test_an_unsupported_deepspeed_fails_naming_each_missing_hook():
    import importlib
    from types import SimpleNamespace

    class EngineWithoutLossHook:  # a DeepSpeed that renamed `_aggregate_total_loss`
        _INSTRUCTION_MAP: dict = {}

        def train_batch(self): ...

    def stand_in(module: str):
        if module == "deepspeed.runtime.pipe.engine":
            return SimpleNamespace(PipelineEngine=EngineWithoutLossHook)
        if module == "deepspeed.comm.torch":
            return SimpleNamespace()
        return importlib.import_module(module)

    missing = [hook.name for hook in deepspeed_adapter.missing_hooks(import_module=stand_in)]
    assert missing == [
        "deepspeed.runtime.pipe.engine.PipelineEngine._aggregate_total_loss",
        "deepspeed.comm.torch._needs_cpu_staging",
    ]
    with pytest.raises(deepspeed_adapter.UnsupportedDeepSpeed) as error:
        deepspeed_adapter.verify_hooks(import_module=stand_in)
    message = str(error.value)
    assert "PipelineEngine._aggregate_total_loss" in message and "_needs_cpu_staging" in message
    assert deepspeed_adapter.SUPPORTED in message


def test_the_installed_deepspeed_is_in_the_pinned_range_and_has_every_hook():
    import tomllib

    import deepspeed
    from packaging.requirements import Requirement
    from packaging.version import Version

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    pins = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["bubbles"]]
    (pin,) = [r for r in pins if r.name == "deepspeed"]
    assert str(pin.specifier) == str(Requirement(f"deepspeed{deepspeed_adapter.SUPPORTED}").specifier)
    assert Version(deepspeed.__version__) in pin.specifier
    assert deepspeed_adapter.missing_hooks() == []


def test_theoretical_bubble_fraction():
    assert theoretical_bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert theoretical_bubble_fraction(1, 8) == 0.0
    with pytest.raises(ValueError, match="micro_batches"):
        theoretical_bubble_fraction(2, 0)


def test_unequal_stages_leave_the_faster_ones_idle_in_the_steady_state_too():
    assert stage_bubble_fractions([1.0] * 4, 8) == pytest.approx([3 / 11] * 4)
    # m=4, the second stage twice as slow: a batch is 4 x 2 + 1 = 9, so the first idles 1 - 4/9
    assert stage_bubble_fractions([1.0, 2.0], 4) == pytest.approx([5 / 9, 1 / 9])


def test_sweep_configs_become_one_fused_guest_per_stage_with_per_trial_rows():
    from types import SimpleNamespace

    from pipeline_bubble.api import guest_results
    from pipeline_bubble.fused_guest import FusedGroupGuest

    configs = [{"lr": 1e-3, "width": 32}, {"lr": 3e-3, "width": 32}]
    guest = _stage_guest(digits, configs, ["t0", "t2"], torch.device("cpu"))
    assert isinstance(guest, FusedGroupGuest)
    executor = BubbleExecutor(guest, profile_steps=3)
    executor.start()
    rows = guest_results(SimpleNamespace(bubble_executor=executor))
    assert [(row["trial_id"], row["config"]["lr"]) for row in rows] == [("t0", 1e-3), ("t2", 3e-3)]
    assert all(row["steps"] == 3 and "val_loss" in row for row in rows)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-group", "one-config"])
def test_a_stage_resumes_its_own_configs_from_its_checkpoint_and_never_another_sweeps(tmp_path, fused):
    """`run_guests_in_bubbles` resumes each stage from `checkpoint_dir/stage<s>.pt`. The job run again
    with other configs and the same folder must not train them on from the first configs' weights,
    optimizer and step count (the results would be reported under the new configs): it is refused
    naming the file. The same configs resume."""
    first = [{"lr": 1e-3, "width": 32, "seed": 0}, {"lr": 3e-3, "width": 32, "seed": 0}][: 2 if fused else 1]
    other = [{**config, "lr": 10 * config["lr"]} for config in first]
    path = tmp_path / "stage0.pt"
    guest = _stage_guest(digits, first, [0, 2][: len(first)], torch.device("cpu"))
    executor = BubbleExecutor(guest, profile_steps=3, checkpoint_path=path)
    executor.start()
    executor.checkpoint()

    again = _stage_guest(digits, first, [0, 2][: len(first)], torch.device("cpu"))
    BubbleExecutor(again, profile_steps=3, checkpoint_path=path).start()
    assert again.steps == 2 * 3, "the same configs go on from their checkpoint"

    changed = _stage_guest(digits, other, [0, 2][: len(other)], torch.device("cpu"))
    with pytest.raises(ValueError, match="cannot resume this guest from it: it holds the progress of config") as error:
        BubbleExecutor(changed, profile_steps=3, checkpoint_path=path).start()
    assert str(path) in str(error.value) and len(str(error.value).splitlines()) == 1
    assert changed.steps == 0


def test_a_failing_guest_is_dropped_and_the_stage_carries_on():
    class Failing(_TimedGuest):
        def step(self):
            if self.steps >= 3:
                raise RuntimeError("guest blew up")
            return super().step()

    clock = _Clock()
    executor = BubbleExecutor(Failing(clock, 0.001), profile_steps=2, history=1, clock=clock)
    executor.start()
    _observed(executor, slot=0, wait_s=0.05)
    executor.begin_batch()
    executor.harvest(0, _Recorder(clock))  # must not raise
    assert executor.guest is None and "guest blew up" in executor.failed


def test_a_guest_source_that_raises_or_a_guest_that_cannot_say_whether_it_is_ready_never_fails_the_job():
    """A lending stage asks its source for a sweep's group between batches, inside the job's
    `train_batch`: a group that cannot be built there (a member's config its model refuses) or
    whose actor has gone (`ready()` raising) is dropped like a guest whose step raises; the job's
    batch ends normally and the next group is taken."""
    clock = _Clock()
    closed = []

    class Gone(_TimedGuest):
        def ready(self):
            raise RuntimeError("the group's actor died")

        def close(self, failure):
            closed.append(failure)

    offers = iter([ValueError("dropout probability has to be between 0 and 1, but got 1.5"), Gone(clock, 0.001),
                   _TimedGuest(clock, 0.001)])

    def source():
        offer = next(offers)
        if isinstance(offer, Exception):
            raise offer
        return offer

    executor = BubbleExecutor(None, profile_steps=2, history=1, clock=clock, guest_source=source)
    executor.start()
    executor.begin_batch()
    executor.end_batch()  # must not raise: the job's batch ends as usual
    assert executor.guest is None and "dropout probability" in executor.failed
    executor.begin_batch()
    executor.end_batch()  # the next group's actor has gone: dropped, told why
    assert executor.guest is None and "the group's actor died" in executor.failed and closed == [executor.failed]
    executor.begin_batch()
    executor.end_batch()
    assert isinstance(executor.guest, _TimedGuest) and executor.step_time_s == pytest.approx(0.001)


def test_lending_bubbles_without_ray_connected_is_refused_instead_of_starting_a_ray_of_the_ranks_own():
    """A rank that calls `lend_bubbles` before `ray.init(address=...)` would have Ray start a
    cluster of its own (every rank one, listening beyond loopback) where no sweep's groups are:
    the job would train on and lend to no one. It is refused, naming the missing call."""
    code = (
        "import ray, pipeline_bubble\n"
        "try:\n"
        "    pipeline_bubble.lend_bubbles(object())\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
        "print('ray started:', ray.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "call ray.init(address=...) before it" in out and "ray started: False" in out, out


def test_requested_eviction_checkpoints_before_the_next_step(tmp_path):
    executor, clock = _executor(0.001, history=1, checkpoint_path=tmp_path / "g.pt")
    guest = executor.guest
    _observed(executor, slot=0, wait_s=0.05)
    executor.begin_batch()
    executor.request_evict()
    assert executor.harvest(0, _Recorder(clock)) == 0.0
    assert executor.guest is None and guest.steps == 2
    assert torch.load(tmp_path / "g.pt", weights_only=False)["guest"] == {"steps": 2}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_stages_on_one_gpu_harvest_and_stay_bit_identical(tmp_path):
    spec = ABSpec(stages=2, micro_batches=4, width=2048, micro_batch_size=128, batches=6, device="cuda")
    results = launch(run_rank, 2, spec, timeout_s=300, log_dir=tmp_path, same_device=True)
    assert all(r["losses"]["baseline"] == r["losses"]["harvested"] and r["rng_equal"] for r in results)
    assert all(StageTimeline.from_dict(r["timelines"]["baseline"]).device.startswith("cuda") for r in results)
