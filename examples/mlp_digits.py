"""The digits MLP example; its code is `hpo/examples/mlp_digits.py` (installed with the package).

This name keeps `from examples.mlp_digits import workload` working from a checkout.
"""

from hpo.examples.mlp_digits import *  # noqa: F401,F403
