"""A live job's checkpoint is never unpickled: plain data as JSON, tensors through
``torch.load(weights_only=True)``; what another host could have planted is refused."""

from __future__ import annotations

import io
import os
import pickle
import stat

import pytest
import torch

from scheduler_bridge.live.job_runner import CHECKPOINT_FILE, JobContext


class Planted:
    """Unpickling this would run code: it touches a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def ctx(tmp_path, rank=0) -> JobContext:
    return JobContext(job_id=0, attempt=1, rank=rank, world_size=1, gpus=1, local_gpus=1,
                      batch_size=None, checkpoint_dir=str(tmp_path / "ckpt"))


def test_plain_state_round_trips_as_private_json(tmp_path):
    c = ctx(tmp_path)
    c.save_checkpoint({"step": 7, "lrs": [0.1, 0.01], "done": False})
    path = tmp_path / "ckpt" / CHECKPOINT_FILE
    assert path.read_bytes().startswith(b"{"), "plain state is stored as JSON"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert c.load_checkpoint() == {"step": 7, "lrs": [0.1, 0.01], "done": False}


def test_tensor_state_round_trips_through_weights_only_load(tmp_path):
    c = ctx(tmp_path)
    model = torch.nn.Linear(3, 2)
    c.save_checkpoint({"step": 3, "model": model.state_dict()})
    got = c.load_checkpoint()
    assert got["step"] == 3 and torch.equal(got["model"]["weight"], model.weight.detach())


def test_state_that_would_need_pickle_is_refused_when_saved_not_at_resume(tmp_path):
    with pytest.raises(TypeError, match="plain data or tensors"):
        ctx(tmp_path).save_checkpoint({"step": 1, "obj": Planted(str(tmp_path / "x")), "t": torch.zeros(1)})
    assert not (tmp_path / "ckpt" / CHECKPOINT_FILE).exists()


def test_a_planted_torch_archive_is_refused_without_running_its_code(tmp_path):
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"t": torch.zeros(1), "x": Planted(str(marker))}, buf)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / CHECKPOINT_FILE).write_bytes(buf.getvalue())
    with pytest.raises(pickle.UnpicklingError):
        ctx(tmp_path).load_checkpoint()
    assert not marker.exists()


def test_a_legacy_pickled_checkpoint_is_refused_by_name_and_never_loaded(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.pkl").write_bytes(pickle.dumps(Planted(str(marker))))
    with pytest.raises(ValueError, match="checkpoint.pkl: pickled checkpoints are not loaded"):
        ctx(tmp_path).load_checkpoint()
    assert not marker.exists()


def test_a_damaged_checkpoint_names_its_file(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / CHECKPOINT_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=f"{CHECKPOINT_FILE}: damaged checkpoint"):
        ctx(tmp_path).load_checkpoint()


def test_only_rank_zero_writes(tmp_path):
    ctx(tmp_path, rank=1).save_checkpoint({"step": 1})
    assert ctx(tmp_path).load_checkpoint() is None
