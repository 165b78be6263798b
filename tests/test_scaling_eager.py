"""Eager transfer: the target starts after a fraction of the proxy trials and follows the best."""

import math
from types import SimpleNamespace

import pytest

from hpo.scaling import Decision, EagerTransferPolicy


def test_waits_until_the_fraction_of_proxy_trials_has_finished_then_starts_with_the_best():
    policy = EagerTransferPolicy(fraction=0.5, num_trials=4, mode="min")
    assert policy.record("a", {"lr": 1}, 2.0) == Decision.WAIT
    assert policy.record("b", {"lr": 2}, 1.5) == Decision.START
    assert policy.running_config == {"lr": 2}


def test_keeps_the_target_while_the_best_is_unchanged_and_restarts_on_a_better_config():
    policy = EagerTransferPolicy(fraction=0.25, num_trials=4, mode="min")
    assert policy.record("a", {"lr": 1}, 2.0) == Decision.START
    assert policy.record("b", {"lr": 2}, 3.0) == Decision.KEEP
    assert policy.record("c", {"lr": 3}, 1.0) == Decision.RESTART
    assert policy.running_config == {"lr": 3}
    assert policy.record("d", {"lr": 4}, 1.0) == Decision.KEEP, "a tie is not better"


def test_mode_max_follows_the_largest_metric():
    policy = EagerTransferPolicy(fraction=0.25, num_trials=4, mode="max")
    policy.record("a", {"lr": 1}, 0.5)
    assert policy.record("b", {"lr": 2}, 0.9) == Decision.RESTART


def test_errored_or_diverged_trials_count_as_finished_but_are_never_transferred():
    policy = EagerTransferPolicy(fraction=0.5, num_trials=4, mode="min")
    assert policy.record("a", {"lr": 9}, None) == Decision.WAIT
    assert policy.record("b", {"lr": 8}, math.nan) == Decision.WAIT, "no usable config yet"
    assert policy.record("c", {"lr": 1}, 2.0) == Decision.START
    assert policy.running_config == {"lr": 1}


def test_a_first_start_waits_for_idle_resources_but_a_restart_does_not():
    policy = EagerTransferPolicy(fraction=0.25, num_trials=4, mode="min")
    assert policy.record("a", {"lr": 1}, 2.0, idle=False) == Decision.WAIT
    assert policy.decide(idle=True) == Decision.START
    assert policy.record("b", {"lr": 2}, 1.0, idle=False) == Decision.RESTART


@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match="fraction must be in"):
        EagerTransferPolicy(fraction=fraction, num_trials=4)


def _trial(trial_id, lr, value, status="TERMINATED"):
    config = {"width": 16, "lr": lr, "steps_per_iteration": 2}
    return SimpleNamespace(trial_id=trial_id, config=config, last_result={"val_loss": value}, status=status)


@pytest.fixture(scope="module")
def local_ray():
    """A fresh local Ray for this module; `address="local"` so that a cluster someone else started
    on this machine (or a stale /tmp/ray/ray_current_cluster) is never joined."""
    import os

    ray = pytest.importorskip("ray")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": repo}},
    )
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_callback_starts_restarts_and_trains_the_target_on_ray(local_ray):
    from examples.mlp_digits import workload as mlp_digits
    from hpo.scaling import EagerTransferCallback, ScalingConfig

    scaling = ScalingConfig(target_width=32, ratio=2, eager_transfer=0.5, target_cpus=1)
    callback = EagerTransferCallback(mlp_digits, scaling, metric="val_loss", mode="min", max_iterations=2)
    callback.setup(total_num_samples=4)
    callback.on_trial_complete(iteration=1, trials=[], trial=_trial("a", 0.01, 2.0))
    assert not callback.starts, "1 of 4 finished: below the 0.5 fraction"
    callback.on_trial_complete(iteration=2, trials=[], trial=_trial("b", 0.02, 1.0))
    callback.on_step_end(iteration=2, trials=[_trial("c", 0.03, None, "PENDING")])
    assert not callback.starts, "a proxy trial still waits for resources: not idle"
    callback.on_step_end(iteration=2, trials=[_trial("c", 0.03, None, "RUNNING")])  # c is running, none pending: idle
    assert len(callback.starts) == 1, "2 of 4 finished and resources idle: the target starts"
    callback.on_trial_complete(iteration=3, trials=[], trial=_trial("c", 0.03, 1.5))
    callback.on_trial_complete(iteration=4, trials=[], trial=_trial("d", 0.04, 0.5))
    report = callback.finish(timeout_s=120)
    assert [s["proxy_trial"] for s in report["starts"]] == ["b", "d"]
    assert report["restarts"] == 1 and report["complete"]
    assert report["target_run"]["config"] == {"width": 32, "lr": 0.04, "steps_per_iteration": 2}
    assert report["target_iterations_done"] == 2
    assert report["time_to_first_target_result_s"] > report["starts"][-1]["at_s"]
