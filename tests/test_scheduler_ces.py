"""CES energy saving: power states, forecasts and energy on traces whose answer is known."""

import pytest

from scheduler_bridge import ClusterSpec, Job, make_policy, make_trace, simulate
from scheduler_bridge.policies.demand_forecast import DemandForecaster
from scheduler_bridge.policies.ces import CES
from scheduler_bridge.policies.queue import FIFO
from scheduler_bridge.power_model import PowerModel


def _ces(**kw):
    fc = DemandForecaster(bin_s=100, lookback=100, horizon=0, days=0)
    return CES(FIFO(backfill=True), forecaster=fc, margin=0.0, spare_nodes=0, interval=100,
               power=PowerModel(boot_delay=50.0), **kw)


def test_idle_nodes_power_down_and_a_late_job_waits_exactly_the_boot_delay():
    trace = make_trace([Job(0, 0.0, 1, 10.0), Job(1, 1000.0, 1, 10.0)])
    res = simulate(trace, _ces(), ClusterSpec(16, 8))
    df, s = res.jobs_frame(), res.summary()
    assert df.start.tolist() == [0.0, 1050.0], "node 0 was off at t=1000 and boots for 50 s"
    assert s["max_power_wait_s"] == 50.0
    # node 1 is off from t=0, node 0 is on for [0, 200) and from its boot at 1000 to 1060
    assert s["powered_node_hours"] == pytest.approx(260 / 3600)
    assert s["on_utilization"] == pytest.approx(20 / (260 * 8))
    joules = 600 * 260 + 250 * 20 + 10 * (1060 + 800)
    assert s["energy_kwh"] == pytest.approx(joules / 3.6e6)


def test_without_ces_every_node_is_powered_for_the_whole_run():
    trace = make_trace([Job(0, 0.0, 1, 10.0), Job(1, 1000.0, 1, 10.0)])
    s = simulate(trace, make_policy("fifo"), ClusterSpec(16, 8)).summary()
    assert s["powered_node_hours"] == pytest.approx(2 * 1010 / 3600)
    assert s["on_utilization"] == pytest.approx(s["utilization"])


def test_nodes_stay_on_while_jobs_wait_even_above_the_target():
    # 1 node, two 8-GPU jobs: the second waits for the first, so the node never powers down
    trace = make_trace([Job(0, 0.0, 8, 500.0), Job(1, 1.0, 8, 500.0)])
    res = simulate(trace, _ces(), ClusterSpec(8, 8))
    assert res.jobs_frame().start.tolist() == [0.0, 500.0]
    assert res.summary()["power_downs"] == 0


def test_forecast_uses_the_same_time_of_day_yesterday():
    fc = DemandForecaster(bin_s=600, lookback=600, horizon=3600, days=1, quantile=1.0)
    fc.record(86400 - 3600 + 1200, 80.0)      # yesterday, 40 min into the window
    fc.record(86400 * 2 - 3600, 0.0)          # now: idle
    assert fc.forecast(86400 * 2 - 3600) == 80.0


@pytest.mark.parametrize("name", ["ces:fifo", "ces:tiresias", "ces:qssf"])
def test_ces_is_named_ces_and_its_base(name):
    assert make_policy(name).name == name


def test_ces_refuses_a_base_it_cannot_wrap():
    with pytest.raises(ValueError, match="ces base policy"):
        make_policy("ces:elastic")
    with pytest.raises(ValueError, match="power model"):
        PowerModel(boot_delay=-1)
