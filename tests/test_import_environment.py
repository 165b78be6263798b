"""Importing an engine changes no process-wide setting, and whatever leads to a local Ray sets Ray's
loopback-only switch before Ray is imported (the listeners themselves: `test_ray_exposure.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.base.ray_runtime import LOOPBACK_ONLY_ENV
from patience import patience
from pipeline_bubble.cpu_ops import EXTENSIONS_DIR_VAR

REPO = Path(__file__).resolve().parents[1]
#: What importing a package of this project once set: fresh processes start without them.
SET_BEFORE = (LOOPBACK_ONLY_ENV, EXTENSIONS_DIR_VAR)


def run_fresh(code: str) -> str:
    """The last line `code` prints in a fresh interpreter, with none of `SET_BEFORE` in its environment."""
    env = {key: value for key, value in os.environ.items() if key not in SET_BEFORE}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=patience(120))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()[-1]


@pytest.mark.parametrize("package", ["fusion", "pipeline_bubble", "scheduler_bridge"])
def test_importing_an_engine_adds_nothing_to_the_environment(package):
    changed = run_fresh(f"import json, os; before = dict(os.environ); import {package}; "
                        "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    assert json.loads(changed) == {}, f"import {package} changed the environment"


def test_the_hpo_command_sets_the_loopback_switch_as_it_is_imported():
    assert run_fresh(f"import os, hpo.cli; print(os.environ.get({LOOPBACK_ONLY_ENV!r}))") == "0"


@pytest.mark.slow
def test_a_ray_reached_through_hpos_public_names_binds_to_loopback():
    """`hpo.Tuner` imports Ray; the address Ray would give a local node is decided then."""
    address = run_fresh("from hpo import Tuner; import ray; print(ray.util.get_node_ip_address())")
    assert address == "127.0.0.1"
