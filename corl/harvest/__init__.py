"""Harvesting conversations from an agent team's traffic, as pure functions (no HTTP, no Redis): which
requests are opted in and sampled, what a request's conversation is, the size bounds, the redaction,
the readers of logged traffic (``corl data import``) and the canary rule. The gateway service
(``corl.services.gateway``) and the CLI do the I/O."""

from .policy import conversation_of, digest, entry_id, opted_in, sampled, too_large
from .redact import RedactionFailed, Redactor

__all__ = [
    "RedactionFailed",
    "Redactor",
    "conversation_of",
    "digest",
    "entry_id",
    "opted_in",
    "sampled",
    "too_large",
]
