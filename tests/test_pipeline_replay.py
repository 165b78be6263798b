"""The pipeline replayer on synthetic profiles (no processes), plus one real profile of a DeepSpeed job (slow).

A synthetic profile is recorded from a known truth: every instruction's cost is fixed, the
truth's timeline is the dependency graph run with those costs, and its batches (with or without
batch-to-batch noise) are what the instrumented engine would have recorded. The replay must
give that truth back, behave as the closed form where the closed form holds, and move the way a
pipeline moves when a configuration changes.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_bubble.profile import LayerProfile, PipelineConfig, ProfileError, build_profile, load_profile
from pipeline_bubble.replay import Cost, ReplayWarning, _Graph, machine_warning, piecewise_affine, predict, replay, size_scale
from pipeline_bubble.timeline import COMPUTE, BatchRecord, StageTimeline, theoretical_bubble_fraction
from pipeline_bubble.train_schedule import LOSS_BROADCAST, exchange_partners, stage_instructions

from hpo.base.machine import fingerprint


def _truth(config: PipelineConfig, forward: list[float], backward: list[float], *, transfer=5e-4, gap=1e-4,
           optimizer=0.01, load=1e-3, tail=1e-4, collective: tuple[float, float] | None = None, broadcast=None) -> _Graph:
    """Fixed costs of every instruction of `config` (per-stage forward and backward per micro-batch;
    `optimizer` and `collective` (work before the gradient norm's all-reduce, its own time) a
    stage, or per stage)."""
    costs = []
    for stage in range(config.stages):
        row = []
        step = optimizer[stage] if isinstance(optimizer, list) else optimizer
        for instruction in stage_instructions(config.micro_batches, config.stages, stage):
            duration = {
                "ForwardPass": forward[stage], "BackwardPass": backward[stage], "LoadMicroBatch": load,
                "OptimizerStep": step, "ReduceGrads": step / 4, "ReduceTiedGrads": 0.0,
                LOSS_BROADCAST: transfer if broadcast is None else broadcast,
            }.get(instruction.name, transfer)
            inside = None
            if instruction.name == "OptimizerStep" and collective is not None:
                inside = collective[stage] if isinstance(collective, list) else collective
            row.append(Cost(gap, duration, (stage, instruction.name), inside))
        costs.append(row)
    return _Graph(config, costs, [tail] * config.stages, [tail] * config.stages)


def _record(truth: _Graph, *, batches: int = 4, noise: float = 0.0, seed: int = 0) -> list[StageTimeline]:
    """What the instrumented engine records of the truth: `batches` batches back to back, each cost
    scaled by up to ±`noise`."""
    rng = random.Random(seed)
    config = truth.config
    timelines = [StageTimeline(s, config.stages, config.micro_batches, "cpu") for s in range(config.stages)]
    run = None
    for batch in range(batches):
        draw = (lambda key: 1 + rng.uniform(-noise, noise)) if noise else None
        run = truth.run(draw=draw, starts=run.next_starts if run else None)
        for timeline, replayed in zip(timelines, run.timelines):
            record = replayed.batches[0]
            timeline.batches.append(BatchRecord(batch, record.start, record.end, record.intervals))
    return timelines


def _layers(split: tuple[int, ...], forward: list[float], backward: list[float]) -> list[LayerProfile]:
    layers = []
    for stage, count in enumerate(split):
        layers += [LayerProfile(f"Block{stage}", 1000, 4096, forward[stage] / count, backward[stage] / count) for _ in range(count)]
    return layers


def _profile(config: PipelineConfig, forward, backward, *, noise: float = 0.0, batches: int = 4, **truth):
    split = config.split or tuple([2] * config.stages)
    config = PipelineConfig(config.stages, config.micro_batches, config.micro_batch_size, split)
    graph = _truth(config, forward, backward, **truth)
    timelines = _record(graph, batches=batches + 1, noise=noise)
    return build_profile(timelines, config, _layers(split, forward, backward), job={"job": "synthetic"}), graph


def test_a_profile_recorded_in_blocks_between_other_work_leaves_out_each_blocks_warm_up_and_the_time_between_blocks():
    """As `profiling.profile_and_measure` records it: a block of the profiled configuration before each
    measured block. A block's first batch (here twice as slow) and the other work between blocks
    (here 10 s) are no part of the job's steady state."""
    config, block = PipelineConfig(2, 4, 32, (2, 2)), 3
    forward, backward = [0.010, 0.012], [0.020, 0.022]
    truth = _truth(config, forward, backward)
    timelines = []
    for recorded in _record(truth, batches=3 * block):
        timeline = StageTimeline(recorded.stage, recorded.stages, recorded.micro_batches, recorded.device)
        for index, batch in enumerate(recorded.batches):
            stretch, shift = (2.0 if index % block == 0 else 1.0), 10.0 * (index // block)
            at = lambda t: batch.start + shift + (t - batch.start) * stretch  # noqa: E731
            intervals = [replace(i, start=at(i.start), end=at(i.end)) for i in batch.intervals]
            timeline.batches.append(BatchRecord(index, at(batch.start), at(batch.end), intervals))
        timelines.append(timeline)
    profile = build_profile(timelines, config, _layers((2, 2), forward, backward), job={"job": "synthetic"}, block=block)
    assert profile.batches == 2 * block
    for stage in profile.stages:
        assert max(stage.between_s) < 1.0, "the time between blocks was counted as the job's own loop"
        for instruction in stage.instructions:
            assert max(instruction.duration_s) == pytest.approx(min(instruction.duration_s), abs=1e-9), instruction.name
    assert replay(profile, config).iteration_s == pytest.approx(truth.steady().iteration_s, rel=1e-9)
    with pytest.raises(ProfileError, match="in blocks of 3"):
        build_profile([StageTimeline(t.stage, t.stages, t.micro_batches, t.device, t.batches[:1]) for t in timelines],
                      config, profile.layers, job={"job": "synthetic"}, block=block)


configs = st.builds(
    PipelineConfig,
    stages=st.integers(2, 4),
    micro_batches=st.integers(1, 12),
    micro_batch_size=st.just(32),
)
stage_times = st.lists(st.floats(0.001, 0.05), min_size=4, max_size=4)


# ---- the schedule ------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(stages=st.integers(2, 6), micro_batches=st.integers(1, 24), data=st.data())
def test_the_instruction_stream_is_deepspeeds_train_schedule(stages, micro_batches, data):
    from deepspeed.runtime.pipe.schedule import TrainSchedule

    stage = data.draw(st.integers(0, stages - 1))
    ours = stage_instructions(micro_batches, stages, stage)
    theirs = [(cmd.name, cmd.kwargs.get("buffer_id", -1)) for step in TrainSchedule(micro_batches, stages, stage) for cmd in step]
    assert [(i.name, i.buffer) for i in ours] == theirs + [(LOSS_BROADCAST, -1)]


def test_every_exchange_meets_its_counterpart_and_the_loss_broadcast_meets_the_last_stage():
    streams = [stage_instructions(4, 3, s) for s in range(3)]
    partners = exchange_partners(streams)
    for (stage, slot), others in partners.items():
        for other in others:
            assert (stage, slot) in partners[other], f"{stage}:{slot} meets {other}, which does not meet it"
    assert partners[(0, len(streams[0]) - 1)] == [(2, len(streams[2]) - 1)]
    assert len(partners[(2, len(streams[2]) - 1)]) == 2


# ---- replaying the configuration that was profiled ---------------------------------------------------
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, forward=stage_times, backward=stage_times)
def test_a_profile_replays_its_own_configuration_exactly(config, forward, backward):
    profile, truth = _profile(config, forward, backward)
    truth = truth.steady()
    replayed = replay(profile, profile.config)
    assert replayed.iteration_s == pytest.approx(truth.iteration_s, rel=1e-9)
    assert replayed.bubble_s() == pytest.approx(truth.bubble_s(), abs=1e-9)
    def waits(result):  # which neighbour a wait of no length waits on is a matter of rounding
        return [(w.stage, w.slot, w.neighbour if w.idle_s > 1e-9 else None) for w in result.windows]

    assert waits(replayed) == waits(truth)
    assert predict(profile, profile.config, iterations=5).iteration_s == pytest.approx(truth.iteration_s, rel=1e-9)


def test_a_noisy_profile_predicts_its_own_median_iteration_within_two_percent():
    config = PipelineConfig(2, 8, 32)
    profile, truth = _profile(config, [0.010, 0.012], [0.020, 0.022], noise=0.3, batches=12)
    measured = profile.summary()
    prediction = predict(profile, profile.config, iterations=200)
    assert prediction.iteration_s == pytest.approx(measured["iteration_s"], rel=0.02)


@settings(max_examples=10, deadline=None)
@given(stages=st.integers(2, 5), micro_batches=st.integers(1, 16), step=st.floats(0.001, 0.05))
def test_equal_stages_without_communication_leave_the_closed_form_bubble(stages, micro_batches, step):
    config = PipelineConfig(stages, micro_batches, 32, tuple([2] * stages))
    zero = dict(transfer=0.0, gap=0.0, optimizer=0.0, load=0.0, tail=0.0)
    profile, _ = _profile(config, [step] * stages, [2 * step] * stages, **zero)
    replayed = replay(profile, profile.config)
    assert replayed.iteration_s == pytest.approx((micro_batches + stages - 1) * 3 * step)
    for fraction in replayed.bubble_fraction():
        assert fraction == pytest.approx(theoretical_bubble_fraction(stages, micro_batches))


# ---- configurations the profile did not run --------------------------------------------------------
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forward=stage_times, backward=stage_times, micro_batches=st.integers(1, 12))
def test_more_micro_batches_or_larger_ones_never_shorten_the_iteration(forward, backward, micro_batches):
    profile, _ = _profile(PipelineConfig(2, 4, 32), forward, backward)
    base = replay(profile, PipelineConfig(2, micro_batches, 32)).iteration_s
    assert replay(profile, PipelineConfig(2, micro_batches + 1, 32)).iteration_s >= base
    assert replay(profile, PipelineConfig(2, micro_batches, 64)).iteration_s >= base


@st.composite
def profiles_and_targets(draw):
    """A profile of 2 to 8 stages (2 layers each, noisy or not) and a configuration it did not run:
    2 to 8 stages over the same layers, 1 to 64 micro-batches of another size, guests or none."""
    stages = draw(st.integers(2, 8))
    times = st.lists(st.floats(1e-4, 0.05), min_size=stages, max_size=stages)
    profile, _ = _profile(PipelineConfig(stages, draw(st.integers(1, 16)), 32), draw(times), draw(times),
                          noise=draw(st.sampled_from([0.0, 0.2])))
    target = draw(st.integers(2, 2 * stages))
    share, rest = divmod(2 * stages, target)
    split = tuple(share + (i < rest) for i in range(target))
    return profile, PipelineConfig(target, draw(st.integers(1, 64)), draw(st.sampled_from([16, 32, 64])), split,
                                   guest_step_s=draw(st.sampled_from([None, 1e-4, 1e-3, 5e-3])))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=profiles_and_targets())
def test_any_replayed_configuration_lasts_at_least_every_stages_work_with_bubbles_that_are_never_negative(case):
    """Guest steps, planned into a replay of typical costs, may delay the job but never hurry it.
    (One stage is no pipeline: `PipelineConfig` refuses it, "stages must be >= 2".)"""
    profile, config = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplayWarning)
        replayed = replay(profile, config)
        without = replay(profile, replace(config, guest_step_s=None))
    for timeline in replayed.timelines:
        batch = timeline.batches[0]
        assert replayed.iteration_s >= batch.total(COMPUTE), "a stage worked longer than the iteration"
        assert all(interval.end >= interval.start for interval in batch.intervals)
    assert min(replayed.bubble_s()) >= 0 and all(w.idle_s >= 0 and w.blocked_s >= 0 for w in replayed.windows)
    assert replayed.iteration_s >= without.iteration_s, "guest steps shortened the iteration"


def test_more_micro_batches_shrink_the_bubble_fraction_of_balanced_stages():
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02])
    fractions = [max(replay(profile, PipelineConfig(2, m, 32)).bubble_fraction()) for m in (2, 4, 8, 16)]
    assert fractions == sorted(fractions, reverse=True), fractions


def test_a_layer_moved_between_stages_moves_its_time_with_it():
    profile, _ = _profile(PipelineConfig(2, 4, 32, (2, 2)), [0.010, 0.020], [0.020, 0.040])
    even = replay(profile, PipelineConfig(2, 4, 32, (2, 2)))
    shifted = replay(profile, PipelineConfig(2, 4, 32, (3, 1)))

    def forward(result, stage):
        return next(i.duration for i in result.timelines[stage].batches[0].intervals if i.name == "ForwardPass")

    assert forward(shifted, 0) == pytest.approx(forward(even, 0) + 0.010)  # one of stage 1's layers, 20 ms / 2
    assert forward(shifted, 1) == pytest.approx(forward(even, 1) - 0.010)


def test_the_stage_first_at_the_optimizer_steps_all_reduce_waits_there_and_a_moved_layer_moves_only_its_work():
    """DeepSpeed clips gradients by default: every stage's optimizer step all-reduces the gradient
    norm, so the stage that gets there first (the last: it ends its backward passes first) waits
    for the others inside its step. The profile times that collective; the replay waits there
    too, and when a split gives a stage fewer parameters only its own work shrinks, not the wait."""
    even, shifted = PipelineConfig(2, 4, 32, (2, 2)), PipelineConfig(2, 4, 32, (3, 1))

    def truth(config: PipelineConfig) -> _Graph:  # 1000 parameters, 10 us of forward, 20 of backward a layer
        per_stage = config.split
        return _truth(config, [0.010 * n for n in per_stage], [0.020 * n for n in per_stage],
                      optimizer=[0.005 * n for n in per_stage], collective=[(0.001 * n, 0.0005) for n in per_stage])

    timelines = _record(truth(even), batches=4)
    profile = build_profile(timelines, even, _layers((2, 2), [0.020, 0.020], [0.040, 0.040]), job={"job": "synthetic"})
    steps = [next(i for i in s.instructions if i.name == "OptimizerStep") for s in profile.stages]
    assert all(len(step.collective) == profile.batches for step in steps)
    assert steps[1].duration_s[0] > steps[0].duration_s[0] + 0.01, "the last stage's step holds its wait"
    for config in (even, shifted):
        predicted, expected = replay(profile, config), truth(config).steady()
        assert predicted.iteration_s == pytest.approx(expected.iteration_s, rel=1e-9), config.label
        for stage in range(2):
            assert _pass_s(predicted, stage, "OptimizerStep") == pytest.approx(_pass_s(expected, stage, "OptimizerStep"), rel=1e-9)


def test_what_a_stage_spends_beyond_its_layers_own_times_stays_with_it_when_layers_move():
    """The last stage's forward pass also computes the loss, which no layer's time holds (its layers
    timed on their own say so): moving a layer off it moves that layer's own time, not a share of the loss."""
    config = PipelineConfig(2, 4, 32, (2, 2))
    layer, loss = 0.004, 0.003
    profile, _ = _profile(config, [2 * layer, 2 * layer + loss], [0.010, 0.010])
    for entry in profile.layers:
        entry.timed_at = [[16, layer / 2, 0.0025], [32, layer, 0.005]]
    shifted = replay(profile, PipelineConfig(2, 4, 32, (3, 1)))
    assert _pass_s(shifted, 0, "ForwardPass") == pytest.approx([3 * layer] * 4)
    assert _pass_s(shifted, 1, "ForwardPass") == pytest.approx([layer + loss] * 4)


def _pass_s(result, stage: int, name: str) -> list[float]:
    return [i.duration for i in result.timelines[stage].batches[0].intervals if i.name == name]


#: Per stage, a layer's cost a + b * micro-batch size (forward; backward), two layers a stage.
AFFINE = {"ForwardPass": ([0.004, 0.002], [1e-4, 3e-4]), "BackwardPass": ([0.010, 0.006], [2e-4, 5e-4])}


def _affine(name: str, stage: int, size: int) -> float:
    intercepts, slopes = AFFINE[name]
    return intercepts[stage] + slopes[stage] * size


def _affine_profile(timed_sizes: list[int]):
    """A profile at micro-batch 32 whose stages cost `AFFINE`, its layers timed at `timed_sizes`."""
    forward, backward = ([_affine(name, s, 32) for s in range(2)] for name in AFFINE)
    profile, _ = _profile(PipelineConfig(2, 4, 32, (2, 2)), forward, backward)
    for index, layer in enumerate(profile.layers):
        stage = index // 2
        layer.timed_at = [[m, _affine("ForwardPass", stage, m) / 2, _affine("BackwardPass", stage, m) / 2] for m in timed_sizes]
    return profile


@pytest.mark.parametrize("size", [8, 16, 48, 128])
def test_layers_timed_at_two_sizes_predict_an_affine_cost_exactly_between_and_beyond_them(size):
    result = replay(_affine_profile([16, 32]), PipelineConfig(2, 4, size))
    for stage in range(2):
        for name in AFFINE:
            assert _pass_s(result, stage, name) == pytest.approx([_affine(name, stage, size)] * 4)


@pytest.mark.parametrize("timed_sizes", [[], [32]])
def test_layers_timed_at_one_size_scale_in_proportion_to_the_micro_batch(timed_sizes):
    profile = _affine_profile(timed_sizes)
    profiled, doubled = replay(profile, PipelineConfig(2, 4, 32)), replay(profile, PipelineConfig(2, 4, 64))
    for stage in range(2):
        for name in AFFINE:
            assert _pass_s(doubled, stage, name) == pytest.approx([2 * t for t in _pass_s(profiled, stage, name)])


def test_a_transfer_keeps_a_gloo_calls_own_cost_and_scales_the_rest_with_its_bytes():
    """The loss broadcast carries one number: its transfer is what a call costs whatever it carries."""
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02], transfer=0.002, broadcast=0.0005)
    for size, expected in ((32, 0.002), (64, 0.0005 + 2 * 0.0015), (16, 0.0005 + 0.0015 / 2)):
        result = replay(profile, PipelineConfig(2, 4, size))
        assert _pass_s(result, 0, "SendActivation") == pytest.approx([expected] * 4), size
    cheap, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02], transfer=0.0005, broadcast=0.002)
    assert _pass_s(replay(cheap, PipelineConfig(2, 4, 64)), 1, "SendGrad") == pytest.approx([0.0005] * 4)


def test_a_cost_extrapolated_below_its_intercept_is_zero_not_negative():
    points = [(16.0, 0.001), (32.0, 0.003), (64.0, 0.005)]
    assert [piecewise_affine(points, x) for x in (16, 24, 32, 48, 64, 96)] == pytest.approx([0.001, 0.002, 0.003, 0.004, 0.005, 0.007])
    assert piecewise_affine(points, 4) == 0.0


def test_a_noisy_timing_never_makes_a_larger_micro_batch_cheaper():
    layer = LayerProfile("Linear", 1000, timed_at=[[16, 0.004, 0.008], [32, 0.003, 0.009], [64, 0.005, 0.012]])
    assert size_scale(layer, 1, 32, 16) == 1.0  # 32 timed faster than 16: taken as 16's time
    assert size_scale(layer, 1, 48, 32) == pytest.approx(0.0045 / 0.004)
    assert size_scale(layer, 2, 64, 32) == pytest.approx(0.012 / 0.009)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stages=st.integers(3, 4), micro_batches=st.integers(1, 8))
def test_a_two_stage_profile_replays_deeper_pipelines(stages, micro_batches):
    profile, _ = _profile(PipelineConfig(2, 4, 32, (4, 4)), [0.01, 0.01], [0.02, 0.02])
    split = (2,) * (stages - 1) + (8 - 2 * (stages - 1),)
    result = replay(profile, PipelineConfig(stages, micro_batches, 32, split))
    assert len(result.timelines) == stages and result.iteration_s > 0


def test_a_configuration_the_profile_cannot_describe_is_refused_naming_it():
    profile, _ = _profile(PipelineConfig(2, 4, 32, (2, 2)), [0.01, 0.01], [0.02, 0.02])
    with pytest.raises(ProfileError, match="split holds 5 layers; the job has 4"):
        replay(profile, PipelineConfig(2, 4, 32, (3, 2)))
    with pytest.raises(ProfileError, match="give a split"):
        replay(profile, PipelineConfig(3, 4, 32))


# ---- guests ----------------------------------------------------------------------------------------
def test_steady_windows_hold_whole_guest_steps_at_no_cost():
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.030], [0.020, 0.060])
    step = 0.004
    prediction = predict(profile, PipelineConfig(2, 4, 32, guest_step_s=step), iterations=5)
    assert prediction.slowdown == pytest.approx(0.0, abs=1e-12)
    windows = prediction.typical.windows
    expected = sum(int(w.idle_s / step + 1e-9) * step for w in windows)
    assert sum(prediction.guest_s) == pytest.approx(expected)
    assert expected > 0


def test_guest_steps_far_shorter_than_the_windows_are_counted_not_replayed_one_by_one():
    """`--config guest=1e-9` (a nanosecond step, a typo for 1e-3 say) fills every window with
    millions of steps: the replay counts them as the executor would take them and answers at once,
    where stepping through them one by one never ended."""
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.030], [0.020, 0.060])
    answered = threading.Event()
    predictions = []

    def run() -> None:
        predictions.append(predict(profile, PipelineConfig(2, 4, 32, guest_step_s=1e-9), iterations=5))
        answered.set()

    threading.Thread(target=run, daemon=True).start()
    assert answered.wait(timeout=60), "the replay stepped through the guest steps one by one"
    (prediction,) = predictions
    idle = sum(w.idle_s for w in prediction.typical.windows)
    assert sum(prediction.guest_s) == pytest.approx(idle, rel=1e-6) and idle > 0, "every window filled"
    assert prediction.slowdown == pytest.approx(0.0, abs=1e-6)


def test_guest_steps_longer_than_every_window_are_never_admitted():
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.012], [0.020, 0.024])
    longest = max(w.idle_s for w in replay(profile, profile.config).windows)
    prediction = predict(profile, PipelineConfig(2, 4, 32, guest_step_s=2 * longest), iterations=10)
    assert sum(prediction.guest_s) == 0 and prediction.slowdown == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=st.floats(0.001, 0.02), signals=st.booleans(), seeded=st.booleans())
def test_admitting_guests_never_speeds_the_job_up(step, signals, seeded):
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.020], [0.020, 0.030], noise=0.4, batches=8)
    prediction = predict(profile, PipelineConfig(2, 4, 32, guest_step_s=step), iterations=30, signals=signals, seeded=seeded)
    assert prediction.slowdown >= 0.0


def test_noisy_windows_make_guests_overrun_and_cost_the_job_time():
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.020], [0.020, 0.030], noise=0.5, batches=12)
    prediction = predict(profile, PipelineConfig(2, 4, 32, guest_step_s=0.008), iterations=100)
    assert prediction.slowdown > 0.0
    assert prediction.guest_iteration_s > prediction.iteration_s


# ---- files and machines ------------------------------------------------------------------------------
def test_a_profile_round_trips_through_json(tmp_path):
    profile = _affine_profile([16, 32, 64])
    profile.save(tmp_path / "profile.json")
    again = load_profile(tmp_path / "profile.json")
    assert again == profile
    for size in (32, 64):
        assert replay(again, PipelineConfig(2, 4, size)).iteration_s == replay(profile, PipelineConfig(2, 4, size)).iteration_s


def test_a_profile_recorded_before_layers_were_timed_at_several_sizes_still_reads_and_scales_in_proportion(tmp_path):
    profile = _affine_profile([16, 32])
    data = profile.to_dict()
    for layer in data["layers"]:
        del layer["timed_at"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = load_profile(tmp_path / "old.json")
    assert all(layer.timed_at == [] for layer in old.layers)
    profiled, doubled = replay(old, PipelineConfig(2, 4, 32)), replay(old, PipelineConfig(2, 4, 64))
    assert _pass_s(doubled, 1, "ForwardPass") == pytest.approx([2 * t for t in _pass_s(profiled, 1, "ForwardPass")])


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d.pop("format"), "not a pipeline profile"),
        (lambda d: d.update(version=99), "profile version 99"),
        (lambda d: d["config"].update(micro_batches=5), "not DeepSpeed's TrainSchedule for p=2 m=5"),
        (lambda d: d["stages"][0].pop("tail_s"), r"stages\[0\]: missing key 'tail_s'"),
        (lambda d: d["config"].update(stages=1), "config: stages must be >= 2"),
        (lambda d: d["layers"][1].update(timed_at=[[0, 0.1, 0.2]]), r"layers\[1\].timed_at\[0\]: \[0, 0.1, 0.2\]"),
    ],
)
def test_a_bad_profile_file_is_refused_naming_the_file_and_key(tmp_path, edit, needle):
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02])
    data = profile.to_dict()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=needle) as error:
        load_profile(path)
    assert str(path) in str(error.value)


def test_a_profile_saved_with_a_byte_order_mark_reads_as_the_same_profile(tmp_path):
    """A profile re-saved by an editor that writes a UTF-8 byte-order mark was refused as "not JSON
    (Unexpected UTF-8 BOM)"; traces and sweep files read past the mark, and so does a profile."""
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02])
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    profile.save(plain)
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert load_profile(marked) == load_profile(plain)


def test_a_profile_that_is_not_text_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "profile.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ProfileError, match="not a pipeline profile \\(byte 0xff at offset 0 is not UTF-8 text\\)"):
        load_profile(path)
    assert _cli(["--profile", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err, err


def _optimizer_step(data: dict, stage: int) -> dict:
    return next(i for i in data["stages"][stage]["instructions"] if i["name"] == "OptimizerStep")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d["layers"][0].update(forward_s="fast"), "layers[0].forward_s: 'fast' is not a number >= 0"),
        (lambda d: d["layers"][0].update(params=None), "layers[0].params: None is not an integer >= 0"),
        (lambda d: d["layers"][0].update(timed_at=[["a", 1, 1], [32, 1, 1]]), "layers[0].timed_at[0]: ['a', 1, 1] is not"),
        (lambda d: d["stages"][0]["instructions"][3].update(duration_s=[float("nan")] * 4), "instructions[3].duration_s[0]: nan"),
        (lambda d: d["stages"][0]["instructions"][3]["duration_s"].__setitem__(1, -1.0), "instructions[3].duration_s[1]: -1.0"),
        (lambda d: d["stages"][0]["instructions"][3].update(duration_s=["a"] * 4), "instructions[3].duration_s[0]: 'a'"),
        (lambda d: d["stages"][0]["instructions"][3].update(gap_s=[]), "instructions[3].gap_s: 0 gaps for 4 batches"),
        (lambda d: d["stages"][0].update(tail_s=[]), "stages[0].tail_s: 0 tails for 4 batches"),
        (lambda d: d["stages"][0].update(tail_s="x"), "stages[0].tail_s: a list expected, got 'x'"),
        (lambda d: d["stages"][1].update(stage=7), "stages[1].stage: 7"),
        (lambda d: d.update(stages=d["stages"][::-1]), "stages[0].stage: 1"),
        (lambda d: d["stages"][0].update(layers=[0, 20]), "stages[0].layers: [0, 20] is not"),
        (lambda d: _optimizer_step(d, 0).update(collective=[[1]] * 4), "collective[0]: [1] is not a pair"),
        (lambda d: d.update(machine=None), "machine: a mapping expected, got None"),
        (lambda d: d.update(device=3), "device: a string expected, got 3"),
        (lambda d: d.update(batches=0), "batches: 0 is not an integer >= 1"),
        (lambda d: d.update(config="p=2"), "config: a mapping of"),
        (lambda d: d["config"].update(micro_batch_size=32.5), "config: micro_batch_size must be an integer, got 32.5"),
        (lambda d: d["config"].update(split=[1, 3]), "config.split: [1, 3], but the stages hold [2, 2]"),
    ],
)
def test_a_hand_edited_profile_is_refused_in_one_line_naming_the_key_and_the_value(tmp_path, capsys, edit, needle):
    """Every value a replay reads is checked when the file is read: a wrong type, a NaN or a
    negative time, a list too short for the profiled batches, stages out of order, or a split the
    stages do not hold is one line with exit status 2, never a traceback or a NaN prediction."""
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02])
    data = profile.to_dict()
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as error:
        load_profile(path)
    assert needle in str(error.value) and str(path) in str(error.value), error.value
    assert _cli(["--profile", str(path), "--iterations", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_a_profile_from_another_machine_replays_with_a_warning_naming_what_differs():
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02])
    profile.machine = {**fingerprint(), "cpu": "Some Other CPU", "host": "elsewhere"}
    with pytest.warns(ReplayWarning, match="Some Other CPU") as caught:
        result = replay(profile, profile.config)
    assert "elsewhere" in str(caught[0].message) and result.warnings


def test_a_profile_from_this_machine_replays_silently():
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.01, 0.01], [0.02, 0.02])
    assert machine_warning(profile) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        replay(profile, PipelineConfig(2, 8, 32))


def test_replaying_imports_no_deepspeed_torch_or_ray():
    code = (
        "import sys, pipeline_bubble.replay, pipeline_bubble.accuracy, pipeline_bubble.profile;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'deepspeed', 'ray'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_pipeline_jobs_profile_gives_the_allocator_its_predicted_bubble_capacity(tmp_path):
    from scheduler_bridge.live.cli import bubble_lending
    from scheduler_bridge.live.job_state import JobSpec

    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.020], [0.020, 0.040])
    profile.save(tmp_path / "profile.json")
    fields = bubble_lending(str(tmp_path / "profile.json"), gpus=4)  # two data-parallel copies of 2 stages
    predicted = replay(profile, profile.config)
    assert fields["bubble_capacity_gpu_s"] == pytest.approx(2 * predicted.bubble_capacity_gpu_s())
    assert fields["iteration_s"] == pytest.approx(predicted.iteration_s)
    assert JobSpec(entrypoint="m:f", gpus=4, **fields).bubble_rate == pytest.approx(fields["bubble_capacity_gpu_s"] / predicted.iteration_s)
    with pytest.raises(ValueError, match="cannot run on 3 GPUs"):
        bubble_lending(str(tmp_path / "profile.json"), gpus=3)


# ---- hpo profile pipeline ---------------------------------------------------------------------------
def _cli(argv: list[str]) -> int:
    from hpo.cli import main

    return main(["profile", "pipeline", *argv])


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "give a job file to profile or --profile FILE"),
        (["--profile", "missing.json"], "missing.json: cannot read"),
        (["JOB", "--config", "m=x"], "m='x' is not a valid value"),
        (["JOB", "--config", "speed=3"], "'speed=3' is not KEY=VALUE"),
        (["JOB", "--gantt", "JOB"], "--gantt JOB: not a folder"),
    ],
)
def test_hpo_profile_pipeline_refuses_bad_arguments_in_one_line(tmp_path, capsys, argv, needle):
    job = tmp_path / "job.yaml"
    job.write_text("profile: {stages: 2, micro_batches: 4}\n")
    argv = [str(job) if a == "JOB" else str(tmp_path / a) if a.endswith(".json") else a for a in argv]
    assert _cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err.replace(str(job), "JOB"), err


@pytest.mark.parametrize(
    "text, needle",
    [
        ("profile: {stages: 2}\nspeed: 3\n", "unknown key 'speed'"),
        ("profile: {stages: 2, micro_batchez: 4}\n", "profile: unknown key 'micro_batchez'"),
        ("profile: {stages: 2}\nconfigurations: [{split: [0, 13]}]\n", "configurations[0]: split must give every one"),
        ("profile: [1\n", ":2: malformed YAML"),
        ("profile: {stages: 2}\nbatches: 1\n", "batches: an integer >= 2"),
    ],
)
def test_a_bad_job_file_is_refused_naming_the_file_and_key(tmp_path, capsys, text, needle):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    assert _cli([str(job)]) == 2
    err = capsys.readouterr().err
    assert str(job) in err and needle in err, err


@pytest.mark.parametrize(
    "text, needle",
    [
        ("profile: {stages: 2, micro_batches: 4}\nbatches: 4\nprofile: {stages: 3}\n",
         "job.yaml:3: profile: duplicate key 'profile': first given on line 1, again on line 3"),
        ("batches: 4\nprofile:\n  stages: 2\n  micro_batchez: 4\n", "job.yaml:2: profile: unknown key 'micro_batchez'"),
        ("profile: {stages: 2}\nconfigurations:\n  - {micro_batches: 8}\n  - {split: [0, 13]}\n",
         "job.yaml:4: configurations[1]: split must give every one of the 2 stages >= 1 layer"),
        ("profile: {stages: 2}\n\ndevice: gpu\n", "job.yaml:3: device: cpu or cuda, got 'gpu'"),
        ("profile: {stages: 2}\nspeed: 3\n", "job.yaml:2: speed: unknown key 'speed'"),
    ],
)
def test_a_job_file_is_read_as_a_sweep_file_is_each_problem_naming_its_line(tmp_path, capsys, text, needle):
    """A key given twice is refused (PyYAML would keep the last one unseen, and profile it), and
    every problem names the line of its key, as in a sweep file."""
    job = tmp_path / "job.yaml"
    job.write_text(text)
    assert _cli([str(job), "--out", str(tmp_path / "profile.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{tmp_path}/{needle}" in err, err


def test_a_job_file_reads_seconds_written_with_an_exponent_as_numbers(tmp_path):
    """`guest_step_s: 4e-3` is 4 ms, as YAML 1.2 and a sweep file read it (YAML 1.1 reads a string)."""
    from pipeline_bubble.profile_cli import read_job_file

    job = tmp_path / "job.yaml"
    job.write_text("profile: {stages: 2}\nconfigurations: [{guest_step_s: 4e-3}]\n")
    assert read_job_file(job)["configurations"][0].guest_step_s == 0.004


#: A user's pipeline job in a module of its own (written beside the job file): the digits MLP with a
#: loss whose shapes do not match, so the last stage's first loss raises.
USER_JOB = """\
from dataclasses import dataclass

import torch

from pipeline_bubble.profiling import MLPJob


@dataclass(frozen=True)
class WrongLoss(MLPJob):
    def loss(self, outputs, targets):
        return torch.nn.functional.mse_loss(outputs, targets)
"""


@pytest.mark.parametrize(
    "text, argv, needle",
    [
        ("options: {width: 32, blocks: 2}\nprofile: {stages: 2, split: [3, 3]}\n", [],
         "profile: the split [3, 3] holds 6 layers; the job has 7"),
        ("options: {width: 32, blocks: 2}\nprofile: {stages: 3}\n", [], "profile: 2 blocks cannot fill 3 stages"),
        ("options: {width: -32, blocks: 2}\nprofile: {stages: 2}\n", [], "options: building the job's layers failed: RuntimeError"),
        ("profile: {stages: 2, guest_step_s: 0.004}\n", [], "profile.guest_step_s: a profile is recorded without guests"),
        ("profile: {stages: 2.5}\n", [], "profile: stages must be an integer, got 2.5"),
        ("profile: {stages: 2}\nconfigurations: [{stages: 3}]\n", [],
         "configurations[0]: p=3 m=4 mbs=128: give a split of the job's 13 layers over 3 stages"),
        ("profile: {stages: 2}\nconfigurations: [{split: [5, 5]}]\n", [], "configurations[0]: p=2 m=4 mbs=128 split=5:5: the split holds 10"),
        ("profile: {stages: 2}\n", ["--config", "p=3"], "--config 'p=3': p=3 m=4 mbs=128: give a split"),
        ("job: user_job:Missing\nprofile: {stages: 2}\n", [], "job: cannot import 'user_job:Missing'"),
    ],
)
def test_a_job_that_cannot_be_profiled_as_written_is_refused_before_any_rank_starts(tmp_path, capsys, monkeypatch, text, argv, needle):
    """The job's layers and split and every configuration to predict are checked in the command's own
    process: one line naming the job file's key, before a minute of profiling, not a traceback from
    every rank (or a refusal once the profile is done)."""
    import pipeline_bubble.profiling

    def no_ranks(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(pipeline_bubble.profiling, "launch", no_ranks)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the job file's folder is added to it
    (tmp_path / "user_job.py").write_text(USER_JOB)
    job = tmp_path / "job.yaml"
    job.write_text(text)
    assert _cli([str(job), "--out", str(tmp_path / "profile.json"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "profile.json").exists()


@pytest.mark.slow
def test_a_job_module_beside_its_job_file_is_profiled_from_any_folder_and_a_rank_that_raises_is_one_line(tmp_path):
    """`job: user_job:WrongLoss` names a module beside the job file, found as a sweep's trainable
    is, from whatever folder the command runs in; the loss raising in the last rank is one line
    naming that rank and the exception, with the folder that keeps every rank's log, exit 2."""
    (tmp_path / "user_job.py").write_text(USER_JOB)
    job = tmp_path / "job.yaml"
    job.write_text("job: user_job:WrongLoss\noptions: {width: 16, blocks: 2}\nbatches: 2\n"
                   "profile: {stages: 2, micro_batches: 2, micro_batch_size: 4}\n")
    hpo = Path(sys.executable).with_name("hpo")
    done = subprocess.run([str(hpo), "profile", "pipeline", str(job), "--out", str(tmp_path / "profile.json")],
                          cwd="/", capture_output=True, text=True, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "profiling p=2 m=2 mbs=4 failed: rank 1 raised RuntimeError: The size of tensor a (10)" in err, err
    logs = Path(err.rsplit("every rank's log is in ", 1)[1])
    assert "Traceback" in (logs / "rank1.log").read_text()
    shutil.rmtree(logs)
    assert not (tmp_path / "profile.json").exists()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--profile", "profile.json", "--json", "profile.json"], "--json PATH/profile.json: that is --profile"),
        (["job.yaml", "--out", "job.yaml"], "--out PATH/job.yaml: that is the job file"),
        (["job.yaml", "--out", "profile.json", "--json", "profile.json"], "--json PATH/profile.json: that is --out"),
    ],
)
def test_no_output_of_hpo_profile_pipeline_overwrites_a_file_it_reads_or_writes(tmp_path, capsys, argv, needle):
    """A typo that names one file twice is refused before anything runs: the saved profile (a minute
    or more of profiling) and the job file are never replaced by a table of predictions."""
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.020], [0.020, 0.040])
    profile.save(tmp_path / "profile.json")
    (tmp_path / "job.yaml").write_text("profile: {stages: 2}\n")
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    assert _cli([str(tmp_path / a) if a.endswith((".json", ".yaml")) else a for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err.replace(str(tmp_path), "PATH"), err
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_hpo_profile_pipeline_predicts_from_a_saved_profile_with_charts_and_json(tmp_path, capsys):
    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.020], [0.020, 0.040])
    profile.save(tmp_path / "profile.json")
    out, charts = tmp_path / "predicted.json", tmp_path / "gantt"
    argv = ["--profile", str(tmp_path / "profile.json"), "--config", "m=8", "--config", "m=4,guest=4ms",
            "--iterations", "10", "--json", str(out), "--gantt", str(charts)]
    assert _cli(argv) == 0
    table = capsys.readouterr().out
    assert "p=2 m=8 mbs=32" in table and "guest=4ms" in table
    report = json.loads(out.read_text())
    assert [p["config"]["micro_batches"] for p in report["predictions"]] == [8, 4]
    assert report["predictions"][1]["slowdown"] is not None
    assert len(list(charts.glob("*.png"))) == 4, "one chart per configuration and stage"


def test_every_column_of_the_prediction_table_lines_up_however_long_a_label_or_a_bubble_list(tmp_path, capsys):
    """An 8-stage split's label (39 characters) and its eight bubbles overflowed the fixed widths,
    shifting every later column of that row."""
    profile, _ = _profile(PipelineConfig(4, 4, 32), [0.01] * 4, [0.02] * 4)
    profile.save(tmp_path / "profile.json")
    argv = ["--profile", str(tmp_path / "profile.json"), "--iterations", "3",
            "--config", "p=8,m=6,split=1:1:1:1:1:1:1:1,guest=0.1ms", "--config", "m=8"]
    assert _cli(argv) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    ends = [header.index(name) + len(name) for name in ("iteration ms", "bubble per stage ms", "capacity GPU-ms/it")]
    for row in rows:
        for end in ends:
            assert row[end - 1] != " " and row[end:end + 1] in ("", " "), f"a column ends off {end}:\n{header}\n{row}"


@pytest.mark.slow
def test_hpo_profile_pipeline_profiles_a_deepspeed_job_and_measures_what_it_predicts(tmp_path, capsys):
    """The whole path on a real 2-process DeepSpeed pipeline (gloo): profile, replay, measure, chart."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "options: {width: 128, blocks: 4}\nbatches: 3\nprofile: {stages: 2, micro_batches: 4, micro_batch_size: 32}\n"
        "configurations: [{micro_batches: 4}, {micro_batches: 8, guest_step_s: 0.001}]\n"
    )
    out = tmp_path / "compared.json"
    argv = [str(job), "--out", str(tmp_path / "profile.json"), "--measure", "--batches", "4", "--iterations", "10",
            "--json", str(out), "--gantt", str(tmp_path / "gantt")]
    assert _cli(argv) == 0, capsys.readouterr().err
    assert "profiled in the measuring processes" in capsys.readouterr().out, "the table's profile is the measuring run's"
    profile = load_profile(tmp_path / "profile.json")
    assert profile.stage_split() == (6, 7) and all(layer.forward_s > 0 for layer in profile.layers if layer.params)
    assert all([entry[0] for entry in layer.timed_at] == [16, 32, 64] for layer in profile.layers)
    assert all(entry[1] > 0 for layer in profile.layers if layer.params for entry in layer.timed_at)
    for stage in profile.stages:
        for instruction in stage.instructions:
            assert len(instruction.host) == len(instruction.device) == profile.batches
            assert bool(instruction.waits_on) == (instruction.name in ("SendActivation", "RecvActivation", "SendGrad",
                                                                         "RecvGrad", LOSS_BROADCAST))
    rows = json.loads(out.read_text())["rows"]
    assert [r["label"] for r in rows] == ["p=2 m=4 mbs=32", "p=2 m=8 mbs=32 guest=1ms"]
    guest = rows[1]["guest"]
    # The seeded executor ran and its guest steps were measured; whether a 1 ms step fits the first
    # batches' windows depends on the host's load then (it harvested nothing in them in one full-suite
    # run, on a quiet host). That a seeded executor harvests from its first batch is specified on
    # scripted timings (test_pipeline_bubble.py) and measured by benchmarks/pipeline_replay.py.
    assert rows[1]["seeded"] and len(guest["first_batches_guest_s"]) == 3 and guest["step_s"]["admitted"] == 0.001
    assert len(list((tmp_path / "gantt").glob("*.png"))) == 4


@pytest.mark.slow
def test_a_profile_recorded_in_the_measuring_processes_holds_a_block_per_measured_block(tmp_path):
    """`profile_and_measure`: the profiled configuration trains on its own engine a block before each
    measured block, so the profile and the measurement see the same host."""
    from pipeline_bubble.profiling import MeasureRun, MLPJob, profile_and_measure

    runs = [MeasureRun(PipelineConfig(2, 2, 16)), MeasureRun(PipelineConfig(2, 4, 16))]
    profile, measured = profile_and_measure(MLPJob(width=64), PipelineConfig(2, 2, 16), runs, block=2, rounds=2, log_dir=tmp_path)
    assert profile.batches == 4, "one kept batch from each of the 2 x 2 profiled blocks"
    steps = [next(i for i in s.instructions if i.name == "OptimizerStep") for s in profile.stages]
    assert all(len(step.collective) == 4 for step in steps), "the gradient norm's all-reduce inside every optimizer step"
    assert profile.stage_split() == (6, 7) and all(layer.forward_s > 0 for layer in profile.layers if layer.params)
    assert [m.config for m in measured] == [r.config for r in runs]
    assert all(len(t.batches) == 4 for m in measured for t in m.timelines), "the profile's batches are not the measured run's"
    assert predict(profile, runs[1].config, iterations=5).iteration_s > 0


def test_an_engine_given_its_jobs_profile_is_seeded_with_its_own_stages_predicted_windows():
    from types import SimpleNamespace

    from pipeline_bubble.api import predicted_windows

    profile, _ = _profile(PipelineConfig(2, 4, 32), [0.010, 0.020], [0.020, 0.040])
    engine = SimpleNamespace(num_stages=2, micro_batches=8, stage_id=1, train_micro_batch_size_per_gpu=lambda: 64)
    windows = predicted_windows(engine, profile)
    assert windows == replay(profile, PipelineConfig(2, 8, 64)).seed_windows(1)
    assert windows and all(slot_window >= 0 for slot_window in windows.values())
    with pytest.raises(ValueError, match="the profile is of 2 stages; this engine has 3"):
        predicted_windows(SimpleNamespace(num_stages=3, micro_batches=8, stage_id=0, train_micro_batch_size_per_gpu=lambda: 64), profile)


@pytest.mark.cuda
@pytest.mark.slow
def test_a_pipeline_sharing_one_gpu_is_profiled_on_the_devices_clock_and_replays(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from pipeline_bubble.profiling import MLPJob, profile_pipeline

    profile = profile_pipeline(MLPJob(width=2048), PipelineConfig(2, 4, 128), batches=4, device="cuda", log_dir=tmp_path)
    assert profile.device.startswith("cuda") and all(layer.forward_s > 0 for layer in profile.layers if layer.params)
    assert replay(profile, PipelineConfig(2, 16, 128)).iteration_s > replay(profile, profile.config).iteration_s
