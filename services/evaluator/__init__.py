"""The evaluator: held-out accuracy of the served members, read through their servers every few weight
versions, for the aggregator's stats and dashboard, Prometheus and the experiment trackers."""

from .app import create_app
from .settings import EvaluatorSettings

__all__ = ["EvaluatorSettings", "create_app"]
