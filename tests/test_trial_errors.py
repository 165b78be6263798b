"""Which failures hold a trial's retries back: an exception its code raised before its first
report repeats on a retry; a lost process (an actor killed, a node removed) does not. And what a
failure shows: the user's frames, or a refusal's one line."""

from __future__ import annotations

import io

from hpo.reporting.trial_errors import TrialErrorCallback, raised_in_code

CODE_ERROR = """Failure # 1 (occurred at 2026-11-27_16-08-46)
ray::ImplicitFunc.train() (pid=123, ip=127.0.0.1, actor_id=abc)
  File "/site-packages/ray/tune/trainable/function_trainable.py", line 261, in _trainable_func
    output = fn()
  File "/home/me/train.py", line 7, in train
    width = config["channels"]
KeyError: 'channels'
"""

ACTOR_DIED = """Failure # 1 (occurred at 2026-11-27_16-08-46)
The actor died unexpectedly before finishing this task.
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file.
"""


def test_an_exception_raised_by_the_trials_code_holds_its_retries_back():
    assert raised_in_code(CODE_ERROR)


def test_a_killed_actor_or_lost_node_is_retried_as_tune_would():
    assert not raised_in_code(ACTOR_DIED)


def test_only_the_newest_failure_of_the_error_file_decides():
    assert not raised_in_code(CODE_ERROR + ACTOR_DIED.replace("# 1", "# 2"))
    assert raised_in_code(ACTOR_DIED + CODE_ERROR.replace("# 1", "# 2"))


FUSION_REFUSAL = """Failure # 1 (occurred at 2026-11-27_16-08-46)
ray::FusedGroupTrial.train() (pid=123, ip=127.0.0.1, actor_id=abc)
  File "/site-packages/ray/tune/trainable/trainable.py", line 161, in __init__
    self.setup(copy.deepcopy(self.config))
  File "/repo/hpo/engines/fused/group_trial.py", line 60, in setup
    self.trainer: FusedTrainer | None = FusedTrainer(
  File "/repo/fusion/model.py", line 472, in _check_members
    raise FusionError(
fusion.layers.FusionError: parameter 'a.weight' has a gradient hook (Tensor.register_hook), which fusion cannot carry
"""


class _Trial:
    def __init__(self, path, error_file):
        self.trial_id, self.path, self.error_file = "abc123", str(path), str(error_file)
        self.num_failures, self.max_failures, self.has_reported_at_least_once = 1, 3, False


def test_a_fused_groups_refusal_is_shown_as_its_one_line_not_as_hydro_hpos_frames(tmp_path):
    # the refusal names the layer or parameter in one line; the frames around it are hydro-hpo's
    # own (group trial, trainer, model), which printed four tracebacks for a sweep of two groups
    error_file = tmp_path / "error.txt"
    error_file.write_text(FUSION_REFUSAL)
    stream = io.StringIO()
    TrialErrorCallback(stream).on_trial_recover(0, [], _Trial(tmp_path, error_file))
    shown = stream.getvalue().strip()
    assert "\n" not in shown
    assert shown.endswith(
        ": fusion.layers.FusionError: parameter 'a.weight' has a gradient hook (Tensor.register_hook), which fusion cannot carry"
    )


def test_a_user_error_still_shows_the_users_frames(tmp_path):
    error_file = tmp_path / "error.txt"
    error_file.write_text(CODE_ERROR)
    stream = io.StringIO()
    TrialErrorCallback(stream).on_trial_recover(0, [], _Trial(tmp_path, error_file))
    assert 'File "/home/me/train.py", line 7, in train' in stream.getvalue()
