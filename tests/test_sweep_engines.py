"""The Tuner composes one engine per mode, chosen once when it is built (`engine_for`); each engine
is specified alone by what it hands Tune: the trainable, the search space, the Tune and run configs,
the result."""

from __future__ import annotations

import math
import pickle
import tempfile

import pyarrow.fs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray import tune
from ray.tune.search import BasicVariantGenerator, SearchGenerator, Searcher
from ray.tune.search.optuna import OptunaSearch

from examples.mlp_digits import workload as mlp_digits
from hpo.base.actor_names import NAMESPACE, broker_name
from hpo.config.spec import CheckpointPolicy, FusionConfig
from hpo.engines._base import SweepEngine, SweepPlan
from hpo.engines.bubbles.engine import BubbleEngine
from hpo.engines.bubbles.relay_trial import FusionCallback
from hpo.engines.fused.engine import FusedEngine
from hpo.engines.fused.scheduler import GroupScheduler
from hpo.engines.fused.members import MemberBook
from hpo.engines.fused.search import MEMBERS_KEY, ConfigList, GroupSearcher
from hpo.engines.plain import FunctionEngine, WorkloadEngine
from hpo.engines.scaled import ScaledEngine
from hpo.reporting.dashboard_actor import ControllerCallback
from hpo.tuner.atomic_storage import AtomicLocalHandler
from hpo.tuner.tuner import Tuner

SPACE = {"lr": tune.grid_search([1e-3, 1e-2, 3e-2, 1e-1]), "width": 16}
PROXY_SPACE = {"lr": tune.grid_search([1e-3, 1e-2])}  # scaling sets the width


def tuner(tmp_path, space=SPACE, **options) -> Tuner:
    return Tuner(
        mlp_digits,
        param_space=space,
        tune_config=tune.TuneConfig(metric="val_loss", mode="min"),
        run_config=tune.RunConfig(name="engines", storage_path=str(tmp_path), stop={"training_iteration": 2}),
        **options,
    )


def plan(trainable, max_iterations: int = 3, metric: str | None = "val_loss", resources=None, **options) -> SweepPlan:
    return SweepPlan(trainable, resources or {"cpu": 1}, SPACE, tune.TuneConfig(metric=metric, mode="min"),
                     max_iterations, iterations=max_iterations, **options)


def test_the_tuner_chooses_the_engine_of_its_mode_once_when_it_is_built(tmp_path):
    def train(config):
        tune.report({"val_loss": 0.0})

    function = Tuner(train, tune_config=tune.TuneConfig(metric="val_loss", mode="min")).engine
    plain = tuner(tmp_path).engine
    fused = tuner(tmp_path, fusion=FusionConfig(max_members=4)).engine
    bubbles = tuner(tmp_path, fusion=FusionConfig(max_members=4, placement="bubbles")).engine
    off = tuner(tmp_path, fusion=FusionConfig(enabled=False)).engine
    scaled = tuner(tmp_path, PROXY_SPACE, scaling={"target_width": 64, "ratio": 4}, fusion=FusionConfig(max_members=2)).engine
    assert [type(e) for e in (function, plain, fused, bubbles, off, scaled)] == [
        FunctionEngine, WorkloadEngine, FusedEngine, BubbleEngine, WorkloadEngine, ScaledEngine
    ]
    assert isinstance(scaled.inner, FusedEngine) and scaled.inner.plan.trainable.name != mlp_digits.name  # the proxy
    assert all(isinstance(e, SweepEngine) for e in (function, plain, fused, bubbles, scaled))


def test_the_python_api_takes_the_fusion_block_as_a_dict_as_it_takes_checkpoint_and_logging(tmp_path):
    fused = tuner(tmp_path, fusion={"max_members": 4}).engine
    assert isinstance(fused, FusedEngine) and fused.fusion.max_members == 4
    assert type(tuner(tmp_path, fusion={"enabled": False}).engine) is WorkloadEngine
    with pytest.raises(ValueError) as caught:  # and checks it as they check theirs: one line naming the key
        tuner(tmp_path, fusion={"max_memberz": 4})
    assert str(caught.value) == "fusion.max_memberz: Extra inputs are not permitted"


CONFIG = tune.TuneConfig(metric="val_loss", mode="min")


def test_a_plain_engine_gives_tune_the_users_space_and_a_results_file_per_trial(tmp_path):
    engine = WorkloadEngine(plan(mlp_digits, resources={"cpu": 2}))
    controller = ControllerCallback("plain", "val_loss", "min")
    run = engine.start(tmp_path / "plain", CONFIG, tune.RunConfig(callbacks=[controller]))
    assert run.actors == [] and run.param_space == SPACE
    assert run.tune_config.reuse_actors, "a workload's trial process serves trial after trial"
    assert run.run_config.stop == {"training_iteration": 3}
    assert run.run_config.callbacks[0] is controller and type(run.run_config.callbacks[1]).__name__ == "ResultsFileCallback"
    assert run.trainable.__name__ == mlp_digits.name  # the workload as a checkpointing Tune function
    config = tune.TuneConfig(metric="val_loss", mode="min", num_samples=3, reuse_actors=True)
    assert engine.start(tmp_path / "plain", config, tune.RunConfig()).tune_config is config


def test_a_plain_engine_without_a_metric_writes_no_results_files(tmp_path):
    engine = WorkloadEngine(plan(mlp_digits, metric=None))
    assert engine.start(tmp_path, CONFIG, tune.RunConfig(callbacks=[])).run_config.callbacks == []


@pytest.mark.parametrize(
    "iterations, every, kept",
    [
        (8, 4, 3),  # checkpoints at 4 and 8: both kept, and one more than written never forces a rewrite
        (12, 4, 4),  # 4, 8, 12
        (3, 4, 2),  # only the last one
        (10, 1, 2),  # ten checkpoints: the two newest
        (100, 4, 2),
    ],
)
def test_a_workload_trial_keeps_the_checkpoints_of_a_short_run_and_the_two_newest_of_a_long_one(tmp_path, iterations, every, kept):
    """Tune rewrites the whole sweep's state whenever a trial has written `num_to_keep` checkpoints
    since the last rewrite; a short trial that keeps all it writes never makes it do so."""
    engine = WorkloadEngine(plan(mlp_digits, iterations, checkpoint=CheckpointPolicy(every=every)))
    assert engine.start(tmp_path, CONFIG, tune.RunConfig()).run_config.checkpoint_config.num_to_keep == kept


def test_a_function_trainable_keeps_the_checkpoints_and_the_stop_its_run_config_says(tmp_path):
    def train(config):
        tune.report({"val_loss": 0.0})

    engine = FunctionEngine(plan(train, 8))
    keep_five = tune.RunConfig(checkpoint_config=tune.CheckpointConfig(num_to_keep=5))
    run = engine.start(tmp_path, CONFIG, keep_five)
    assert run.run_config.checkpoint_config.num_to_keep == 5
    assert run.run_config.stop is None and not run.tune_config.reuse_actors


class SavingCounter(tune.Trainable):
    """A Tune user's class trainable that saves and restores its state."""

    def step(self):
        return {"val_loss": 0.0}

    def save_checkpoint(self, checkpoint_dir):
        return {"val_loss": 0.0}

    def load_checkpoint(self, checkpoint):
        pass


def test_a_class_that_saves_itself_is_checkpointed_as_the_policy_says_unless_its_run_config_says_otherwise(tmp_path):
    def train(config):
        tune.report({"val_loss": 0.0})

    def checkpoints(trainable, run_config=tune.RunConfig()):
        engine = FunctionEngine(plan(trainable, checkpoint=CheckpointPolicy(every=3, at_end=False)))
        config = engine.start(tmp_path, CONFIG, run_config).run_config.checkpoint_config
        return config.checkpoint_frequency, config.checkpoint_at_end

    assert checkpoints(SavingCounter) == (3, False)
    own = tune.RunConfig(checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=5))
    assert checkpoints(SavingCounter, own) == (5, None), "the user's own Tune setting wins"
    # Tune refuses checkpoint settings for a function, and calls a class that cannot save only to fail
    assert checkpoints(train) == checkpoints(Counter) == (0, None)


class Counter(tune.Trainable):
    """A Tune user's class trainable, written without `reset_config`."""

    def setup(self, config):
        self.x = config["lr"]

    def step(self):
        return {"val_loss": self.x}


class ResettingCounter(Counter):
    def reset_config(self, new_config):
        self.x = new_config["lr"]
        return True


def test_trial_processes_are_reused_where_the_trainable_can_take_the_next_config_in_place(tmp_path):
    def train(config):
        tune.report({"val_loss": 0.0})

    unset = tune.TuneConfig(metric="val_loss", mode="min", reuse_actors=None)  # hpo.run's default
    reused = {t: FunctionEngine(plan(t)).start(tmp_path, unset, tune.RunConfig()).tune_config.reuse_actors
              for t in (train, Counter, ResettingCounter)}
    assert reused == {train: True, Counter: False, ResettingCounter: True}


def test_reusing_the_processes_of_a_class_without_reset_config_is_refused_saying_what_it_needs(tmp_path):
    with pytest.raises(ValueError, match=r"reuse_actors=True needs Counter\.reset_config\(new_config\) returning True"):
        FunctionEngine(plan(Counter)).start(tmp_path, tune.TuneConfig(reuse_actors=True), tune.RunConfig())


@pytest.mark.parametrize("mode", [None, "maximize"])
def test_a_metric_without_a_direction_is_refused_rather_than_ranked_as_a_loss(tmp_path, mode):
    """Tune's own get_best_result refuses a metric without a mode; hpo ranked it 'min', so a sweep of
    an accuracy without mode='max' named its worst configuration best."""
    with pytest.raises(ValueError, match=f"mode: give mode='min' or mode='max' with metric='val_accuracy', got {mode!r}"):
        Tuner(mlp_digits, param_space=SPACE, tune_config=tune.TuneConfig(metric="val_accuracy", mode=mode))


@pytest.mark.parametrize("checkpoint, message", [
    ({"evry": 2}, "checkpoint.evry: Extra inputs are not permitted"),
    ({"every": 0}, "checkpoint.every: Input should be greater than or equal to 1"),
])
def test_a_bad_checkpoint_argument_fails_in_one_line_naming_its_key(tmp_path, checkpoint, message):
    """`checkpoint=` is the sweep file's `checkpoint:` block as a dict, checked as `logging=` is."""
    with pytest.raises(ValueError) as caught:
        tuner(tmp_path, checkpoint=checkpoint)
    assert str(caught.value) == message


def test_a_scaled_engine_tunes_through_its_inner_engine_and_gives_it_the_eager_transfer(tmp_path):
    """The inner engine hands the eager transfer each configuration's events (a fused engine: its
    members'), as it does the sweep's other callbacks."""
    scaling = {"target_width": 64, "ratio": 4, "eager_transfer": 0.5}
    engine = tuner(tmp_path, PROXY_SPACE, scaling=scaling).engine
    run = engine.start(tmp_path / "scaled", CONFIG, tune.RunConfig(callbacks=[]))
    proxy = engine.inner.plan.trainable
    assert run.actors == [] and run.param_space == PROXY_SPACE
    assert run.trainable.__name__ == proxy.name != mlp_digits.name
    assert [type(c).__name__ for c in run.run_config.callbacks] == ["EagerTransferCallback", "ResultsFileCallback"]
    assert run.run_config.callbacks[0] is engine.eager


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_fused_engine_gives_tune_groups_and_replays_their_events_per_member(tmp_path):
    engine = FusedEngine(plan(mlp_digits, 2), FusionConfig(max_members=4))
    with pytest.raises(RuntimeError, match=r"start\(experiment"):
        engine.result(None)
    controller = ControllerCallback("fused", "val_loss", "min")
    config = tune.TuneConfig(metric="val_loss", mode="min", max_concurrent_trials=4)
    run = engine.start(tmp_path / "fused", config, tune.RunConfig(callbacks=[controller]))
    assert run.actors == [] and run.param_space == {}  # groups are suggested whole
    assert isinstance(run.tune_config.search_alg, GroupSearcher) and isinstance(run.tune_config.scheduler, GroupScheduler)
    assert run.tune_config.num_samples == -1
    # two slots (2 CPUs) and four configurations: groups of two, and four member trials are two groups
    assert engine.sweep.members_per_group == 2
    assert run.tune_config.max_concurrent_trials == math.ceil(4 / 2)
    # the controller hears members; TensorBoard logs members, in place of Tune's logger of groups
    assert [type(c).__name__ for c in run.run_config.callbacks] == ["MemberCallbacks", "MemberTensorBoard"]
    assert run.run_config.checkpoint_config is engine.sweep.checkpoint_config


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_samples=st.integers(1, 4), grid=st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True))
def test_a_seed_draws_the_same_configurations_in_a_fused_sweep_as_in_a_plain_one(seed, num_samples, grid):
    # the fused engine expands grid and random search itself (`ConfigList`); a user comparing a
    # sweep fused and not, with one seed, compares the same configurations in the same order
    space = {"lr": tune.loguniform(1e-4, 1e-1), "optimizer": tune.choice(["adam", "sgd"]), "width": tune.grid_search(grid),
             "depth": tune.randint(1, 4), "dropout": tune.quniform(0.0, 0.5, 0.1), "momentum": 0.9}
    assert ConfigList(space, num_samples, BasicVariantGenerator(random_state=seed)).configs == plain_configs(space, num_samples, seed)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), drawn=st.integers(0, 8))
def test_a_fused_sweep_of_num_samples_minus_one_draws_without_end_as_tune_does_and_goes_on_after_a_restore(seed, drawn):
    # Tune reads num_samples=-1 as "until the time budget or a stopper ends the sweep"; its
    # variant generator itself draws nothing for -1, and the fused sweep ran no configuration
    space = {"lr": tune.loguniform(1e-4, 1e-1), "width": tune.grid_search([8, 16]), "momentum": 0.9}
    endless = ConfigList(space, -1, BasicVariantGenerator(random_state=seed))
    first = [endless.suggest(f"t{i}") for i in range(drawn + 4)]
    assert first == ConfigList(space, (drawn + 4) // 2 + 1, BasicVariantGenerator(random_state=seed)).configs[:drawn + 4]
    # restored as Tune restores it: unpickled from tuner.pkl as it was built, then its saved state
    restored = pickle.loads(pickle.dumps(ConfigList(space, -1, BasicVariantGenerator(random_state=seed))))
    restored.set_state({"next": drawn})
    assert [restored.suggest(f"r{i}") for i in range(4)] == first[drawn:]
    copied = pickle.loads(pickle.dumps(endless))  # mid-draw, with its draws so far
    assert copied.suggest("next") == endless.suggest("next")


def test_a_fused_sweep_of_num_samples_minus_one_draws_from_the_users_searcher_until_it_finishes(tmp_path):
    # the group searcher read -1 as a count reached before the first draw: the sweep ran nothing
    endless = tune.TuneConfig(metric="val_loss", mode="min", num_samples=-1, search_alg=OptunaSearch(seed=0))
    space = {"lr": tune.loguniform(1e-3, 1e-1), "width": 16}
    engine = FusedEngine(SweepPlan(mlp_digits, {"cpu": 1}, space, endless, 2), FusionConfig(max_members=2))
    sweep = engine.build(tmp_path, members_per_group=2, slots=1)
    assert sweep.configurations is None, "how many configurations the sweep trains is not known"
    groups = [sweep.search_alg.suggest(f"g{i}")[MEMBERS_KEY] for i in range(3)]
    assert [len(members) for members in groups] == [2, 2, 2]


def plain_configs(space: dict, num_samples: int, seed: int, **options) -> list[dict]:
    """The configurations Tune's own variant generator starts for an unfused sweep."""
    plain = BasicVariantGenerator(random_state=seed, **options)
    with tempfile.TemporaryDirectory() as storage:
        plain.add_configurations({"sweep": {"run": _noop, "config": space, "num_samples": num_samples, "storage_path": storage}})
        drawn = []
        while (trial := plain.next_trial()) is not None:
            drawn.append(trial.config)
    return drawn


def _noop(config: dict) -> None:
    pass


def test_a_fused_sweep_starts_with_the_points_to_evaluate_of_the_users_variant_generator():
    space = {"lr": tune.loguniform(1e-4, 1e-1), "optimizer": tune.choice(["adam", "sgd"])}
    first = [{"lr": 0.5, "optimizer": "sgd"}, {"lr": 0.25}]
    user = BasicVariantGenerator(random_state=7, points_to_evaluate=first, max_concurrent=1)  # a sweep file's carries its limit
    configs = ConfigList(space, 4, user).configs
    assert configs[0] == first[0] and configs[1]["lr"] == 0.25 and len(configs) == 4
    assert configs == plain_configs(space, 4, 7, points_to_evaluate=first)  # unlimited
    assert ConfigList(space, 4, user).configs == configs, "the user's generator was used up by the first list"


def test_a_fused_sweeps_searcher_draws_what_tune_draws_with_the_constants_nested_beside_its_suggestions(tmp_path):
    # Tune deep-merges a suggestion into the space: the fixed `eps` beside the searched `beta` is
    # in every trial's config; the fused engine dropped it, so a member trained without it
    space = {"lr": tune.loguniform(1e-4, 1e-1), "width": 16, "opt": {"beta": tune.uniform(0.8, 0.99), "eps": 1e-8}}
    searcher = GroupSearcher(OptunaSearch(seed=5), space, 3, lambda config: 0, MemberBook(tmp_path, "digits"), 3,
                             "val_loss", "min")
    members = searcher.suggest("group")[MEMBERS_KEY]
    assert members == searched_configs(OptunaSearch(seed=5), space, 3)
    assert [m["opt"]["eps"] for m in members] == [1e-8] * 3 and all(m["width"] == 16 for m in members)


def searched_configs(searcher: Searcher, space: dict, num_samples: int) -> list[dict]:
    """The configurations Tune starts for an unfused sweep whose `searcher` suggests them."""
    searcher.set_search_properties("val_loss", "min", space)
    generator = SearchGenerator(searcher)
    with tempfile.TemporaryDirectory() as storage:
        generator.add_configurations({"sweep": {"run": _noop, "config": space, "num_samples": num_samples, "storage_path": storage}})
        return [generator.next_trial().config for _ in range(num_samples)]


def test_a_bubble_engine_starts_the_broker_and_gives_tune_one_relay_per_configuration(tmp_path, ray_local):
    engine = BubbleEngine(plan(mlp_digits, 2), FusionConfig(max_members=4, placement="bubbles"))
    limited = tune.TuneConfig(max_concurrent_trials=3, reuse_actors=True)
    run = engine.start(tmp_path / "relayed", limited, tune.RunConfig(callbacks=[]))
    (broker,) = run.actors
    try:
        assert ray_local.get_actor(broker_name("relayed"), namespace=NAMESPACE) is not None
        assert engine.members_per_group == 4 and run.param_space == SPACE
        assert run.trainable.__name__ == "fused_relayed"
        assert run.tune_config is limited
        assert [type(c) for c in run.run_config.callbacks][-1] is FusionCallback
        assert type(run.run_config.callbacks[0]).__name__ == "ResultsFileCallback"
    finally:
        ray_local.kill(broker)


def test_the_tuner_stores_a_local_run_atomically_whoever_built_its_run_config(tmp_path):
    # hpo.Tuner with the user's own tune.RunConfig, as the README shows it, gets the same storage
    # as hpo.run and `hpo run`: no torn tuner.pkl or state after a killed driver or a full disk
    def handler(run_config):
        return getattr(Tuner(mlp_digits, param_space=SPACE, run_config=run_config).run_config.storage_filesystem, "handler", None)

    assert isinstance(handler(tune.RunConfig(storage_path=str(tmp_path))), AtomicLocalHandler)
    assert isinstance(handler(tune.RunConfig()), AtomicLocalHandler)  # Tune's default folder is local too
    assert handler(tune.RunConfig(storage_path="s3://bucket/runs")) is None  # remote: Arrow's own filesystem
    own = pyarrow.fs.LocalFileSystem()
    assert Tuner(mlp_digits, param_space=SPACE, run_config=tune.RunConfig(storage_filesystem=own)).run_config.storage_filesystem is own
