"""B is chosen from a measured dry run so that a group fits its memory budget with a margin."""

from __future__ import annotations

import logging

import pytest
import torch

from examples.mlp_digits import workload as mlp_digits
from fusion import choose_num_members, measure_member_bytes

MiB = 2**20


def config(width: int) -> dict:
    return mlp_digits.resolve({"width": width, "optimizer": "adam"})


def parameter_bytes(width: int) -> int:
    model = mlp_digits.build_model(config(width))
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_measured_member_cost_covers_weights_gradients_adam_state_and_activations():
    per_member, _ = measure_member_bytes(mlp_digits, config(64))
    weights = parameter_bytes(64)
    activations = 64 * (64 + 64 + 10) * 4  # at least one saved fp32 activation per layer output
    assert per_member >= 4 * weights + activations, (
        f"{per_member} bytes per member cannot hold weights, gradients and two Adam moments ({4 * weights}) plus activations"
    )
    assert per_member < 20 * weights + 100 * activations, f"{per_member} bytes per member is implausibly large"


def test_wider_members_cost_more():
    narrow, _ = measure_member_bytes(mlp_digits, config(32))
    wide, _ = measure_member_bytes(mlp_digits, config(256))
    assert wide > 2 * narrow


def test_chosen_group_fits_the_budget_with_its_safety_margin(caplog):
    budget = 64 * MiB
    with caplog.at_level(logging.INFO, logger="fusion.sizing"):
        decision = choose_num_members(mlp_digits, config(256), available_bytes=budget, safety_margin=0.5)
    used = decision.fixed_bytes + decision.num_members * decision.bytes_per_member
    assert used <= 0.5 * budget < used + decision.bytes_per_member, f"B={decision.num_members} does not fill the budget tightly"
    assert decision.limited_by == "memory"
    assert f"B={decision.num_members}" in caplog.text, "the sizing decision must be logged"


def test_max_members_caps_the_group():
    decision = choose_num_members(mlp_digits, config(32), available_bytes=1024 * MiB, max_members=16)
    assert (decision.num_members, decision.limited_by) == (16, "max_members")


def test_a_budget_below_one_member_is_an_error_not_an_oom():
    with pytest.raises(MemoryError, match="one member needs"):
        choose_num_members(mlp_digits, config(256), available_bytes=64 * 1024)


def test_cpu_budget_defaults_to_available_ram():
    import psutil

    decision = choose_num_members(mlp_digits, config(32))
    assert decision.available_bytes <= psutil.virtual_memory().total
    assert decision.num_members >= 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_group_of_the_chosen_size_trains_within_the_budget_it_was_sized_for():
    from fusion import FusedTrainer

    decision = choose_num_members(mlp_digits, config(256), device="cuda", max_members=1024)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    trainer = FusedTrainer(mlp_digits, [{**config(256), "seed": i} for i in range(decision.num_members)], device="cuda")
    rows = trainer.train_iteration()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    budget = decision.available_bytes * decision.safety_margin
    assert len(rows) == decision.num_members and not any(row["diverged"] for row in rows)
    assert peak <= budget, f"{decision}: the group peaked at {peak / MiB:.1f} MiB, over its {budget / MiB:.1f} MiB budget"


# -- the fused engine owns concurrency (issue 34, item 2) -----------------------------------------

FUSED_TPE = """\
name: t
trainable: mlp_digits
method: tpe
metric: {name: val_loss, goal: minimize}
parameters:
  lr: {distribution: log_uniform_values, min: 0.0001, max: 0.05}
run_cap: 16
max_concurrent_trials: 2
"""


def spec_of(text: str):
    from hpo.config.spec import SweepSpec
    from hpo.config.sweep_file import YamlSource

    return SweepSpec.from_source(YamlSource.from_text(text, "sweep.yaml"))


def test_max_concurrent_trials_never_limits_the_searcher_of_a_fused_sweep(tmp_path):
    """A limit on the searcher caps how many configurations a group can draw: 2 members a group.
    The limit reaches Tune as `max_concurrent_trials`, never on the searcher: Tune puts it on an
    unfused sweep's searcher (a `ConcurrencyLimiter`), the fused engine replaces it by its group
    slots (tests/test_sweep_engines.py)."""
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from hpo.config.sweep_file import load_sweep
    from hpo.tuner.sweep import build_tuner

    def tuner(text: str):
        path = tmp_path / "sweep.yaml"
        path.write_text(text + f"storage_path: {tmp_path}\n")
        return build_tuner(load_sweep(path))

    unfused = tuner(FUSED_TPE)
    run = unfused.engine.start(tmp_path / "t", unfused.tune_config, unfused.run_config)
    assert type(run.tune_config.search_alg) is OptunaSearch and run.tune_config.max_concurrent_trials == 2
    fused = tuner(FUSED_TPE + "fusion: {max_members: 16}\n")
    assert not isinstance(fused.tune_config.search_alg, ConcurrencyLimiter)


def fused(tmp_path, search_alg, num_samples: int, slots: int, capsys):
    from ray import tune

    from hpo.config.spec import FusionConfig
    from hpo.engines._base import SweepPlan
    from hpo.engines.fused.engine import FusedEngine

    space = {"lr": tune.grid_search([1e-3 * (i + 1) for i in range(16)])} if search_alg is None else {"lr": tune.loguniform(1e-4, 1e-1)}
    tune_config = tune.TuneConfig(metric="val_loss", mode="min", num_samples=num_samples, search_alg=search_alg)
    engine = FusedEngine(SweepPlan(mlp_digits, {"cpu": 1}, space, tune_config, 2), FusionConfig(max_members=128))
    sweep = engine.build(tmp_path, 128, slots)
    return sweep.members_per_group, capsys.readouterr().out


def test_groups_shrunk_to_fill_every_slot_say_so_in_one_line(tmp_path, capsys):
    members, printed = fused(tmp_path, None, 1, 2, capsys)
    assert members == 8
    assert printed == "fusion: groups of up to 8 members, not 128: 16 configurations over 2 group slots\n"


def test_a_searchers_concurrency_limiter_that_shrinks_groups_is_named(tmp_path, capsys):
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    members, printed = fused(tmp_path, ConcurrencyLimiter(OptunaSearch(), max_concurrent=2), 64, 2, capsys)
    assert members == 2
    assert printed.startswith(
        "fusion: groups of up to 2 members, not 128: the searcher's ConcurrencyLimiter(max_concurrent=2)"), printed


def test_the_report_gives_the_groups_real_sizes():
    from hpo.engines.fused.members import FusedGroups

    assert str(FusedGroups.of([f"a_m{i:03d}" for i in range(8)] + [f"b_m{i:03d}" for i in range(8)])) == "2 of 8 members each"
    assert str(FusedGroups.of(["a_m000", "a_m001", "b_m000"])) == "2, of 2 and 1 members"
    assert FusedGroups.of(["b_m001", "a_m000", "b_m000"]) == [["a_m000"], ["b_m000", "b_m001"]]
