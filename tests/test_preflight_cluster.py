"""With `--address`, a trial's resources are checked against the cluster's largest node, not this
machine: a sweep may ask for the cluster's GPUs, but not for more than any node has."""

from __future__ import annotations

import textwrap

import pytest

from hpo.cli import main

pytestmark = pytest.mark.slow

SWEEP = """\
trainable: cluster_functions:train
metric: {{name: score, goal: maximize}}
parameters:
  x: {{min: 0.0, max: 1.0}}
resources: {{cpu: 1, gpu: {gpus}}}
"""


@pytest.mark.parametrize(("gpus", "code"), [(2, 0), (8, 2)])
def test_resources_are_checked_against_the_clusters_largest_node(ray_local, tmp_path, capsys, gpus, code):
    (tmp_path / "cluster_functions.py").write_text(
        "def train(config):\n    return {'score': config['x']}\n\n\ntrain.reported_metrics = ('score',)\n"
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(SWEEP.format(gpus=gpus)))
    address = ray_local.get_runtime_context().gcs_address
    assert main(["validate", "--address", address, str(path)]) == code
    err = capsys.readouterr().err
    if code:
        assert f"resources.gpu: a trial asks for 8 GPUs but any node of the cluster at {address} has 4" in err, err
