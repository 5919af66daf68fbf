"""Outside OpenAI-compatible servers as cohort members (``endpoint:`` in the cohort config).

``client.EndpointClient`` samples and judges through ``/chat/completions`` or ``/completions`` and
answers in corl's own shapes (``GenerateResponse`` with text-only samples, verdict scores), so the
round driver, the judging fan-out and ``grade_round`` treat the member like any other; ``bodies``
builds the requests, ``replies`` reads the answers (tolerantly: each server adds its own fields),
``retry`` holds the retry rules, ``usage`` counts requests, tokens and latency.
"""

from .client import EndpointClient, build_endpoint_clients

__all__ = ["EndpointClient", "build_endpoint_clients"]
