"""Held-out readings: when one is due (the rule corl run and the evaluator share), the hash entries the
aggregator reads back, what trackers get, and a reading through a member's server."""

from __future__ import annotations

import httpx
import pytest

from corl.config import parse_config
from corl.heldout import HeldoutReader, is_due, read_readings, tracking_record
from corl.proto import HeldoutAccuracy
from corl.services.aggregator.testing import FakeCohort


@pytest.mark.parametrize(
    ("last", "version", "every", "due"),
    [
        (None, None, 10, True),  # nothing read yet: the start reading, even before the server answers
        (None, 0, 10, True),
        (0, 0, 10, False),  # a frozen member: read once
        (0, 9, 10, False),
        (0, 10, 10, True),
        (0, 25, 10, True),  # several versions at once: one reading, at the served version
        (20, 25, 10, False),  # counted from the last reading, not from multiples of K
        (20, 30, 10, True),
        (3, None, 1, False),  # the server did not say: wait for it
        (3, 4, 1, True),
    ],
)
def test_a_reading_is_due_at_start_and_every_k_versions(
    last: int | None, version: int | None, every: int, due: bool
) -> None:
    assert is_due(last, version, every) is due


def test_hash_entries_parse_back_and_bad_ones_are_skipped() -> None:
    good = HeldoutAccuracy(accuracy=0.625, weight_version=7, at=1.5e9)
    raw = {
        b"a": good.model_dump_json().encode(),
        b"b": b'{"accuracy": 0.5, "weight_version": 2, "at": 1.0}',  # what corl run has always written
        b"c": b"not json",
        b"d": b'{"accuracy": 1.5, "weight_version": 1, "at": 1.0}',  # not an accuracy
        b"e": b'{"accuracy": 0.5}',
        b"\xff": good.model_dump_json().encode(),
    }
    assert read_readings(raw) == {"a": good, "b": HeldoutAccuracy(accuracy=0.5, weight_version=2, at=1.0)}


def test_trackers_get_the_accuracy_against_the_weight_version() -> None:
    rec = tracking_record("gpt2", HeldoutAccuracy(accuracy=0.25, weight_version=12, at=1.0))
    assert (rec.section, rec.axis, rec.step, dict(rec.items())) == (
        "gpt2/heldout",
        "weight_version",
        12,
        {"gpt2/heldout/accuracy": 0.25},
    )


def test_a_reading_goes_through_the_members_first_server() -> None:
    fake = FakeCohort.of("a", "b")
    fake.members["b"].weight_version = 4
    cfg = parse_config({"members": [{"name": n, "model": "unused", "servers": [FakeCohort.url(n)]} for n in "ab"]})
    with httpx.Client(transport=fake.sync_transport()) as http:
        reader = HeldoutReader(cfg, http, eval_prompts=20)
        assert reader.served_version(cfg.member("b")) == 4
        reading = reader.evaluate(cfg.member("b"))
        fake.down.add("a")
        with pytest.raises(httpx.ConnectError):
            reader.served_version(cfg.member("a"))
    # Greedy answers of the fake are right; 20 problems in requests of 8.
    assert (reading.accuracy, reading.weight_version) == (1.0, 4)
    assert fake.members["b"].generated == [(0.0, 1)] * 3 and fake.members["a"].calls == 0
