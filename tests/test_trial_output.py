"""A trial's prints carry its id: the streams a trial runs under, and the trainables Tune is given.
(Through a real `hpo run`, with one process serving two trials: tests/test_cli_user_code.py.)"""

from __future__ import annotations

import inspect
import logging
import sys

import pytest
from ray import tune

from hpo.reporting.trial_output import quiet_exit_in_finalizers, trial_output, with_trial_output


def test_lines_printed_in_a_trial_carry_its_id_on_stdout_and_stderr(capsys):
    with trial_output("abc_00001"):
        print("first")
        print("partial", end="")
        print(" line")
        print("oops", file=sys.stderr)
    print("after")
    out, err = capsys.readouterr()
    assert out == "[trial abc_00001] first\n[trial abc_00001] partial line\nafter\n"
    assert err == "[trial abc_00001] oops\n"


def test_the_streams_and_rays_log_level_come_back_when_the_trial_raises():
    before = sys.stdout, sys.stderr, logging.getLogger("ray").level
    with pytest.raises(ZeroDivisionError):
        with trial_output("abc_00002", ray_log_level="WARNING"):
            assert logging.getLogger("ray").level == logging.WARNING
            1 / 0
    assert (sys.stdout, sys.stderr, logging.getLogger("ray").level) == before


def test_the_next_trial_on_a_reused_process_gets_its_own_prefix_and_nesting_prefixes_once(capsys):
    with trial_output("first_trial"):
        print("a")
    with trial_output("next_trial"):
        with trial_output("next_trial"):  # a class trainable's reset_config calling its setup
            print("b")
    assert capsys.readouterr().out == "[trial first_trial] a\n[trial next_trial] b\n"


def test_a_wrapped_function_is_the_users_to_tune_name_signature_and_resources():
    def my_train(config, extra=None):
        """The user's docstring."""

    wrapped = with_trial_output(tune.with_resources(my_train, {"cpu": 2}))
    assert wrapped.__name__ == "my_train" and wrapped.__doc__ == "The user's docstring."
    assert inspect.signature(wrapped) == inspect.signature(my_train)
    assert wrapped._resources == my_train._resources  # tune.with_resources' request


class Chatty(tune.Trainable):
    def setup(self, config):
        print("setting up")

    def step(self):
        print("stepping")
        return {"done": True}


def test_a_class_trainables_own_methods_print_under_its_trial_id(capsys):
    wrapped = with_trial_output(tune.with_resources(Chatty, {"cpu": 1}))
    assert wrapped.__name__ == "Chatty" and issubclass(wrapped, Chatty)
    trainable = wrapped({})
    trainable.train()
    trainable.stop()
    printed = [line for line in capsys.readouterr().out.splitlines() if "setting" in line or "stepping" in line]
    # Outside Tune a Trainable's trial id is "default".
    assert printed == ["[trial default] setting up", "[trial default] stepping"]


def test_a_worker_ended_by_ray_prints_no_ignored_exception_but_other_finalizer_errors_still_show(capsys, monkeypatch):
    """Ray's SystemExit landing in a weakref callback printed "Exception ignored in ..." after the sweep."""
    class Finalizer:
        def __init__(self, error: BaseException):
            self.error = error

        def __del__(self):
            raise self.error

    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)  # a worker's (pytest sets its own)
    with trial_output("t1"):
        assert sys.unraisablehook is quiet_exit_in_finalizers
    Finalizer(SystemExit(1))
    assert capsys.readouterr().err == ""
    Finalizer(ValueError("a real bug"))
    assert "ValueError: a real bug" in capsys.readouterr().err


def quiet_when_loaded(wrapped):
    """Whether a Ray actor holding `wrapped` (as Tune's trial actor holds the trainable) has the
    quiet hook before it runs any of the trainable's code."""
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        trainable = wrapped

        def hook(self) -> str:
            return getattr(sys.unraisablehook, "__name__", "")

    holder = Holder.remote()
    try:
        return ray.get(holder.hook.remote()) == quiet_exit_in_finalizers.__name__
    finally:
        ray.kill(holder)


def test_a_trials_worker_is_quiet_about_its_end_from_the_moment_it_loads_the_trainable(ray_local):
    """A sweep stopped by its first result had Ray end the trials still starting; one caught
    in a finalizer printed a traceback under the one-line error (CI, stop 39)."""
    def my_train(config):
        raise AssertionError("never runs here")

    assert quiet_when_loaded(with_trial_output(my_train))
    assert quiet_when_loaded(with_trial_output(Chatty))


def test_the_driver_that_unpickles_its_own_trainable_keeps_its_hook(monkeypatch):
    """Tune's registry may load the trainable in the driver: a user's process keeps Python's hook."""
    import ray.cloudpickle

    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    ray.cloudpickle.loads(ray.cloudpickle.dumps(with_trial_output(Chatty)))
    assert sys.unraisablehook is sys.__unraisablehook__
