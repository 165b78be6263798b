"""One trial state for every engine: the resumable data stream, the private RNG, the checkpoint."""

from __future__ import annotations

import itertools

import torch

from examples.mlp_digits import workload as mlp_digits
from hpo.base.trial_state import (
    PrivateRNG,
    ResumableBatches,
    load_trial_state,
    save_trial_state,
    trial_state_bytes,
    trial_state_from_bytes,
)
from hpo.base.training import TrialTrainer


def counting_stream(opened: list[int]):
    def open_stream():
        opened.append(1)
        return ((torch.tensor([i]), torch.tensor([i])) for i in itertools.count())

    return open_stream


def test_a_read_at_any_step_gives_the_batch_an_uninterrupted_stream_gives_there():
    stream = ResumableBatches(counting_stream([]))
    assert [int(stream.batch(s)[0]) for s in (0, 1, 2, 7, 3, 4)] == [0, 1, 2, 7, 3, 4]


def test_reads_in_order_and_a_peek_then_a_read_open_the_stream_once():
    opened: list[int] = []
    stream = ResumableBatches(counting_stream(opened))
    stream.batch(0)
    for step in range(5):
        stream.batch(step)
    assert len(opened) == 1
    stream.batch(2)  # a restore to an earlier step replays the stream
    assert len(opened) == 2


def test_the_workload_stream_is_the_one_the_trainer_trains_on_after_a_restore(tmp_path):
    config = {"lr": 3e-3, "width": 16, "steps_per_iteration": 3}
    uninterrupted = TrialTrainer(mlp_digits, config)
    uninterrupted.train_iteration()
    uninterrupted.save(str(tmp_path))
    expected = uninterrupted.train_iteration()
    restored = TrialTrainer(mlp_digits, config)
    restored.restore(str(tmp_path))
    assert restored.train_iteration() == expected


def test_a_private_stream_leaves_the_global_rng_alone_and_resumes_where_it_stopped():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    rng = PrivateRNG(seed=7)
    with rng.active():
        first = torch.rand(3)
    saved = rng.state_dict()
    with rng.active():
        second = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(first, second)
    again = PrivateRNG(seed=0)
    again.load_state_dict(saved)
    with again.active():
        assert torch.equal(torch.rand(3), second)
    with rng.isolated():
        torch.manual_seed(0)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_trial_state_reads_back_the_same_from_a_file_and_from_bytes(tmp_path):
    state = TrialTrainer(mlp_digits, {"width": 16}).state_dict()
    save_trial_state(state, tmp_path)
    for loaded in (load_trial_state(tmp_path), trial_state_from_bytes(trial_state_bytes(state))):
        assert loaded.keys() == state.keys()
        assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
        assert torch.equal(loaded["rng"], state["rng"])
