"""The coordinate check passes a muP model and fails, naming layers, a standard-parametrised one."""

import pytest

from examples.mlp_digits import workload as mlp_digits
from hpo.scaling import ScalingError, coord_check

WIDTHS = [32, 64, 128, 256]


def test_mup_proxy_passes_and_the_plot_is_saved(tmp_path):
    plot = tmp_path / "coord.png"
    report = coord_check(mlp_digits, WIDTHS, config={"lr": 0.01}, seeds=2, plot_path=str(plot))
    assert report.ok, report.summary()
    assert plot.stat().st_size > 10_000


def test_standard_parametrisation_fails_loudly_naming_the_readout():
    report = coord_check(mlp_digits, WIDTHS, config={"lr": 0.01}, seeds=2, parametrization="sp")
    assert not report.ok
    assert "readout" in report.offending, report.summary()
    with pytest.raises(ScalingError, match=r"FAILED.*readout \(width\*\*"):
        report.raise_for_failure()
