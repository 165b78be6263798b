"""The shipped Grafana dashboard asks only for metrics and labels that Ray's Prometheus endpoint
actually serves for a sweep's controller, and it sits beside Ray's own dashboards without clashing."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from patience import patience

from hpo.reporting.dashboard_actor import start_controller

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "hpo_dashboard.json"
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def used_series(dashboard: dict) -> dict[str, set[str]]:
    """Metric name -> the labels the dashboard's queries filter, group or name legends by."""
    import promql_parser

    used: dict[str, set[str]] = {}

    def walk(node, labels: set[str]) -> None:
        kind = type(node).__name__
        if kind == "VectorSelector":
            used.setdefault(node.name, set()).update(labels | {m.name for m in node.matchers.matchers})
        elif kind == "MatrixSelector":
            walk(node.vector_selector, labels)
        elif kind == "AggregateExpr":
            walk(node.expr, labels | set(node.modifier.labels if node.modifier else ()))
        elif kind == "Call":
            for arg in node.args:
                walk(arg, labels)
        elif kind == "BinaryExpr":
            walk(node.lhs, labels)
            walk(node.rhs, labels)
        elif kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
            walk(node.expr, labels)

    def parse(expr: str, labels: set[str]) -> None:
        # Grafana substitutes its variables before Prometheus sees a query.
        walk(promql_parser.parse(expr.replace("$window", "5m")), labels)

    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            parse(target["expr"], set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", ""))))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = LABEL_VALUES.match(variable["query"]["query"])
            assert match, f"variable {variable['name']} is not a label_values() query"
            parse(match["selector"], {match["label"]})
    return used


def served_series(sweep: str) -> dict[str, dict[str, object]]:
    """What every live node's Prometheus endpoint serves for `sweep`: metric -> labels and value."""
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    served: dict[str, dict[str, object]] = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("sweep") == sweep:
                    served[sample.name] = {"labels": set(sample.labels), "value": sample.value}
    return served


def test_the_dashboard_imports_beside_rays_own_dashboards():
    from ray.dashboard.modules.metrics import grafana_dashboard_factory as factory

    dashboard = load_dashboard()
    ray_uids = {
        getattr(factory, name)()[1] for name in dir(factory) if name.startswith("generate_") and name.endswith("_dashboard")
    }
    assert ray_uids and dashboard["uid"] not in ray_uids
    source = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert source["type"] == "datasource" and source["query"] == "prometheus", "the same datasource choice as Ray's"
    assert all(panel["datasource"] == "${datasource}" for panel in dashboard["panels"])


def test_the_best_metric_panel_keeps_the_least_of_a_minimising_sweeps_series_and_the_most_of_a_maximising_ones():
    # One sweep can be several series (a restarted controller, a resumed sweep beside its old
    # series until Prometheus drops it): `max` over them showed a loss sweep's worst best.
    import promql_parser

    panel = next(p for p in load_dashboard()["panels"] if p["title"] == "Best metric so far")
    (target,) = panel["targets"]
    query = promql_parser.parse(target["expr"])
    assert type(query).__name__ == "BinaryExpr" and str(query.op) == "or", target["expr"]
    aggregation_by_goal = {}
    for side in (query.lhs, query.rhs):
        goal = next(m.value for m in side.expr.matchers.matchers if m.name == "goal")
        aggregation_by_goal[goal] = str(side.op)
    assert aggregation_by_goal == {"min": "min", "max": "max"}, aggregation_by_goal
    assert panel["options"]["legend"]["calcs"] == ["lastNotNull"], "the last value is the best so far, whichever the goal"


@pytest.mark.slow
def test_every_metric_and_label_the_dashboard_queries_is_served_by_rays_prometheus_endpoint(ray_local):
    sweep = "grafana-check"
    controller = start_controller(sweep, "val_loss", "min")
    ray_local.get(controller.update.remote({"t1": "RUNNING", "t2": None}, [(0.5, "t2"), (0.25, "t1")]))
    ray_local.get(controller.update.remote({"t1": "TERMINATED"}))
    used = used_series(load_dashboard())
    assert set(used) == {"ray_hpo_trials_running", "ray_hpo_trials_finished", "ray_hpo_best_metric"}

    deadline = time.monotonic() + patience(60)  # Ray exports metrics every 10 s; they are scraped on demand
    served = served_series(sweep)
    while not set(used) <= set(served) and time.monotonic() < deadline:
        time.sleep(1)
        served = served_series(sweep)
    for name, labels in used.items():
        assert name in served, f"{name} is not served; served: {sorted(served)}"
        assert labels <= served[name]["labels"], f"{name} lacks labels {labels - served[name]['labels']}"
    assert (served["ray_hpo_trials_running"]["value"], served["ray_hpo_trials_finished"]["value"]) == (1, 1)
    assert served["ray_hpo_best_metric"]["value"] == 0.25
    assert "goal" in served["ray_hpo_best_metric"]["labels"]
    ray_local.kill(controller)
