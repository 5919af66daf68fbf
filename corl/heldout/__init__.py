"""Held-out accuracy of the served members, read through their own servers every few weight versions.

One piece for every deployment shape: ``corl run``'s monitor (``corl.embedded.run``) and the evaluator
service (``corl serve evaluator``, ``services/evaluator``) read with ``HeldoutReader``, decide with
``is_due`` and record with ``write_reading`` into the hash the aggregator's stats and dashboard read.
"""

from .reader import HeldoutReader, client_timeout
from .records import HELDOUT_TTL_S, read_readings, tracking_record, write_reading
from .schedule import is_due

__all__ = [
    "HELDOUT_TTL_S",
    "HeldoutReader",
    "client_timeout",
    "is_due",
    "read_readings",
    "tracking_record",
    "write_reading",
]
