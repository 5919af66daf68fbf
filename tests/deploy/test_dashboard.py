"""The Grafana dashboard (one JSON for compose and the chart) queries only metrics the services
really export, and covers what an operator watches."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from .support import DASHBOARD

DASH = json.loads(DASHBOARD.read_text())
METRIC = re.compile(r"\bcorl_[a-z0-9_]+")


def _exported_names() -> set[str]:
    """Every sample name the model server, aggregator, evaluator, gateway and trainer metric modules define."""
    from corl.services.aggregator.metrics import AggregatorMetrics
    from corl.services.evaluator.metrics import EvaluatorMetrics
    from corl.services.gateway.metrics import GatewayMetrics
    from corl.services.model.metrics import ServerMetrics
    from corl.trainer.metrics import TrainerMetrics

    registries: list[CollectorRegistry] = [
        ServerMetrics().registry,
        AggregatorMetrics().registry,
        EvaluatorMetrics().registry,
        GatewayMetrics().registry,
        TrainerMetrics("gpt2").registry,
    ]
    names: set[str] = set()
    for reg in registries:
        for family in reg.collect():
            suffixes = {
                "counter": ["_total", "_created"],
                "histogram": ["_bucket", "_count", "_sum", "_created"],
                "summary": ["_count", "_sum", "_created"],
            }.get(family.type, [""])
            names.update(family.name + s for s in suffixes)
            names.add(family.name)
    return names


def _exprs(panels: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for p in panels:
        out += [(p["title"], t["expr"]) for t in p.get("targets", [])]
        out += _exprs(p.get("panels", []))
    return out


EXPRS = _exprs(DASH["panels"])


@pytest.mark.parametrize(("title", "expr"), EXPRS, ids=[t for t, _ in EXPRS])
def test_every_queried_metric_is_exported(title: str, expr: str) -> None:
    names = _exported_names()
    missing = [m for m in METRIC.findall(expr) if m not in names]
    assert not missing, f"panel {title!r} queries metrics no service defines: {missing}"


def test_metric_names_follow_the_convention() -> None:
    for name in _exported_names():
        assert re.fullmatch(r"corl_(server|aggregator|evaluator|gateway|trainer)_[a-z0-9_]+", name), name


@pytest.mark.parametrize(
    "metric",
    [
        "corl_aggregator_mean_reward",  # per-member reward
        "corl_aggregator_pseudo_label_accuracy",  # accuracy
        "corl_evaluator_heldout_accuracy_ratio",  # held-out accuracy, read through the servers
        "corl_aggregator_distinct_answers",  # diversity
        "corl_aggregator_collapse_alarm",
        "corl_server_weight_version",  # weight versions
        "corl_server_request_duration_seconds_bucket",  # latency
        "corl_aggregator_unconsumed_batches",  # stream backlog
        "corl_aggregator_grader_weight",
        "corl_gateway_prompts_harvested_total",  # harvest: stored, dropped, redacted, trained on
        "corl_gateway_prompts_dropped_total",
        "corl_gateway_prompts_redacted_total",
        "corl_aggregator_harvested_prompts_trained_total",
    ],
)
def test_dashboard_covers(metric: str) -> None:
    assert any(metric in e for _, e in EXPRS), f"no panel shows {metric}"


def test_dashboard_is_portable() -> None:
    """Same file for compose (provisioned datasource) and Kubernetes (sidecar): the datasource is a
    template variable, never a fixed uid."""
    assert DASH["uid"] == "corl-cohort"
    variables = {v["name"]: v for v in DASH["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for p in DASH["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))
