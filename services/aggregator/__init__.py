"""The aggregator: drives rollout rounds, computes peer rewards, feeds trainers through Redis streams,
and runs the grading pool for external agents."""

from .app import create_app
from .settings import AggregatorSettings

__all__ = ["AggregatorSettings", "create_app"]
