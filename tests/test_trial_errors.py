"""Which failures hold a trial's retries back: an exception its code raised before its first
report repeats on a retry; a lost process (an actor killed, a node removed) does not."""

from __future__ import annotations

from hpo.reporting.trial_errors import raised_in_code

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
