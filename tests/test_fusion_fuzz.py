"""The differential fuzzer: no generated model is accepted by fusion and trained differently.

Models come from the grammar in `tests/fusion_fuzz.py` (torch.nn layers and forward idioms, B
members with every per-member hyperparameter drawn, default eps); each is either refused with a
FusionError or trains every member exactly as the member trains alone (float64, 1e-12
relative). The fast profile runs a handful of fixed examples in the fast tier; the long one, in
the slow tier, more of them, bounded to about a minute. `benchmarks/fusion_fuzz.py` runs
thousands and counts the paths taken.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fusion_fuzz import Case, cases, check

FAST = settings(max_examples=6, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
LONG = settings(max_examples=60, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(cases())
def test_a_fused_model_is_refused_or_trains_every_member_as_alone(case: Case):
    check(case)  # raises AssertionError naming the member and what differs


@pytest.mark.slow
@LONG
@given(cases())
def test_a_fused_model_is_refused_or_trains_every_member_as_alone_long(case: Case):
    check(case)
