"""The metrics reference: every Prometheus metric, read from the registry each process builds
(the same ``*Metrics`` classes the services and the trainer instantiate)."""

from __future__ import annotations

from typing import Any

from markdown_text import cell


def registries() -> list[tuple[str, str, Any]]:
    """(process, where it is scraped, registry) for every process that serves /metrics."""
    from corl.services.aggregator.metrics import AggregatorMetrics
    from corl.services.evaluator.metrics import EvaluatorMetrics
    from corl.services.gateway.metrics import GatewayMetrics
    from corl.services.model.metrics import ServerMetrics
    from corl.services.sandbox.serving import SandboxMetrics
    from corl.tracking.metrics import TrackingMetrics
    from corl.trainer.metrics import TrainerMetrics

    return [
        ("Model server", "`GET /metrics` of `corl serve model`", ServerMetrics().registry),
        ("Aggregator", "`GET /metrics` of `corl serve aggregator`", AggregatorMetrics().registry),
        ("Evaluator", "`GET /metrics` of `corl serve evaluator`", EvaluatorMetrics().registry),
        ("Sandbox", "`GET /metrics` of `corl serve sandbox`", SandboxMetrics().registry),
        ("Gateway", "`GET /metrics` of `corl serve gateway`", GatewayMetrics().registry),
        ("Trainer", "`corl train`, on `CORL_TRAINER_METRICS_PORT`", TrainerMetrics(member="member").registry),
        (
            "Experiment tracking",
            "on the registry of every process that reports to a tracker (trainers, aggregator, evaluator)",
            TrackingMetrics().registry,
        ),
    ]


def exposed_name(collector: Any) -> str:
    """The name a scrape shows: prometheus_client adds ``_total`` to counters (histograms expose
    ``_bucket``, ``_sum`` and ``_count`` under their name)."""
    family = collector.describe()[0]
    return family.name + ("_total" if family.type == "counter" else "")


def rows(registry: Any) -> list[str]:
    # The registry knows its collectors only through this attribute; describe() gives name, type and help,
    # and the label names live on each metric.
    collectors = sorted(registry._collector_to_names, key=exposed_name)
    out = []
    for collector in collectors:
        family = collector.describe()[0]
        labels = ", ".join(f"`{label}`" for label in getattr(collector, "_labelnames", ())) or "—"
        out.append(f"| `{exposed_name(collector)}` | {family.type} | {labels} | {cell(family.documentation)} |")
    return out


def page() -> str:
    lines = [
        "# Metrics reference",
        "",
        "Generated at build time from the Prometheus registries the processes build (each service and the "
        "trainer define their metrics in one module; names follow `corl_<subsystem>_<name>_<unit>`).",
        "Labels are bounded: a member, a route template, a status, a tracker, never a request id.",
        "",
    ]
    for process, where, registry in registries():
        lines += [
            f"## {process}",
            "",
            f"Scraped from {where}.",
            "",
            "| metric | type | labels | help |",
            "|---|---|---|---|",
            *rows(registry),
            "",
        ]
    return "\n".join(lines)
