"""ScalingConfig: the `scaling:` block validates once, with errors that name the fix."""

import pytest
from pydantic import ValidationError

from hpo.scaling import ScalingConfig


def test_ratio_gives_the_proxy_width_and_base_defaults_to_the_target():
    scaling = ScalingConfig(target_width=1024, ratio=8)
    assert (scaling.proxy, scaling.base) == (128, 1024)


def test_proxy_width_and_explicit_base_width_are_used_as_given():
    scaling = ScalingConfig(target_width=1024, proxy_width=256, base_width=512)
    assert (scaling.proxy, scaling.base) == (256, 512)


@pytest.mark.parametrize("sizes", [{}, {"proxy_width": 128, "ratio": 8}])
def test_exactly_one_of_proxy_width_and_ratio_is_required(sizes):
    with pytest.raises(ValidationError, match="exactly one of 'proxy_width'.*and 'ratio'"):
        ScalingConfig(target_width=1024, **sizes)


def test_a_ratio_that_does_not_divide_the_target_width_is_refused():
    with pytest.raises(ValidationError, match="ratio 3.0 does not divide target_width 1024"):
        ScalingConfig(target_width=1024, ratio=3)


def test_a_proxy_as_wide_as_the_target_is_refused():
    with pytest.raises(ValidationError, match="must be smaller than target_width"):
        ScalingConfig(target_width=128, proxy_width=128)


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_eager_transfer_must_be_a_fraction_in_0_1(fraction):
    with pytest.raises(ValidationError, match="eager_transfer"):
        ScalingConfig(target_width=1024, ratio=8, eager_transfer=fraction)


def test_unknown_keys_are_refused():
    with pytest.raises(ValidationError, match="proxy_widht"):
        ScalingConfig(target_width=1024, proxy_widht=128)
