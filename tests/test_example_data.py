"""The built-in `mlp_digits` trains on exactly scikit-learn's digits, though its trial processes
read the bundled file without importing scikit-learn (which costs a process over a second)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from sklearn.datasets import load_digits

from hpo.examples import mlp_digits


def test_digits_are_scikit_learns_digits():
    features, labels = mlp_digits._digits_arrays()
    reference = load_digits()
    np.testing.assert_array_equal(features, reference.data)
    np.testing.assert_array_equal(labels, reference.target)


def test_loading_the_digits_does_not_import_scikit_learn():
    code = ("import sys; from hpo.examples.mlp_digits import load_digits_split; "
            "(x, y), _ = load_digits_split(); assert x.shape == (1437, 64), x.shape; "
            "print(sorted(name for name in sys.modules if name.split('.')[0] == 'sklearn'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
