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


def test_depth_ratio_gives_the_proxy_depth_and_the_base_depth_defaults_to_the_proxys():
    scaling = ScalingConfig(target_width=256, ratio=4, target_depth=16, depth_ratio=4)
    assert (scaling.depth_proxy, scaling.depth_base, scaling.depth_alpha) == (4, 4, 1.0)
    assert (scaling.base, ScalingConfig(target_depth=16, depth_ratio=4, base_depth=16).depth_base) == (256, 16)
    assert scaling.describe() == (
        "proxy width 64 -> target width 256; proxy depth 4 -> target depth 16 (CompleteP, alpha 1, base depth 4)"
    )


def test_a_depth_only_proxy_scales_no_width():
    scaling = ScalingConfig(target_depth=8, proxy_depth=2, depth_alpha=0.5)
    assert (scaling.scales_width, scaling.proxy, scaling.base) == (False, None, None)
    assert scaling.describe() == "proxy depth 2 -> target depth 8 (Depth-muP, alpha 0.5, base depth 2)"


@pytest.mark.parametrize(
    "keys, message",
    [
        ({}, "needs target_width .*, target_depth .* or both"),
        ({"target_depth": 8}, "exactly one of 'proxy_depth'.*and 'depth_ratio'"),
        ({"target_depth": 8, "depth_ratio": 3}, "depth_ratio 3.0 does not divide target_depth 8"),
        ({"target_depth": 8, "proxy_depth": 8}, "proxy_depth .8. must be smaller than target_depth .8."),
        ({"target_width": 64, "ratio": 2, "proxy_depth": 2}, "scaling.proxy_depth needs target_depth"),
        ({"target_depth": 8, "proxy_depth": 2, "depth_alpha": 2}, "depth_alpha"),
    ],
)
def test_depth_keys_are_checked_with_the_fix_named(keys, message):
    with pytest.raises(ValidationError, match=message):
        ScalingConfig(**keys)


def test_the_scaled_sizes_may_not_be_searched():
    scaling = ScalingConfig(target_width=256, ratio=4, target_depth=8, proxy_depth=2)
    problems = scaling.searched_size_problems({"lr": None, "width": None, "n_layer": None}, depth_key="n_layer")
    assert problems == {
        "width": "with scaling, width is set by scaling.proxy_width/ratio: remove 'width' from the parameters",
        "n_layer": "with scaling, n_layer is set by scaling.proxy_depth/depth_ratio: remove 'n_layer' from the parameters",
    }
