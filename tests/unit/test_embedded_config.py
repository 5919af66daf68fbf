"""The embedded run's config: ``teachers=start`` adds each trained member's starting weights as its
teacher; anything else under that key is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corl.embedded.config import embedded_config


def _cohort(tmp_path: Path) -> Path:
    (tmp_path / "cohort.json").write_text(json.dumps({"members": [{"name": "a"}, {"name": "b"}]}))
    return tmp_path


def test_start_teachers_are_frozen_copies_voting_for_their_member(tmp_path: Path) -> None:
    cohort = _cohort(tmp_path)
    cfg = embedded_config(cohort, tmp_path / "run", "redis://x:1/0", overrides={"teachers": "start"})
    assert [(m.name, m.role, m.teacher_of) for m in cfg.members] == [
        ("a", "trained", None),
        ("b", "trained", None),
        ("a-start", "frozen", "a"),
        ("b-start", "frozen", "b"),
    ]
    assert cfg.members[2].model == cfg.members[0].model
    assert len({m.servers[0] for m in cfg.members}) == 4  # every teacher has its own server
    assert cfg.teachers() == {"a-start": "a", "b-start": "b"}
    with pytest.raises(ValueError, match="the one kind of teacher is 'start'"):
        embedded_config(cohort, tmp_path / "run", "redis://x:1/0", overrides={"teachers": "ema"})


def test_a_harvesting_run_gets_a_gateway_on_loopback(tmp_path: Path) -> None:
    """corl run starts the gateway where gateway.url says (its port kept, on loopback), or on a free port
    when the rounds read the pool and no url is given; a run that does neither starts none."""
    cohort = _cohort(tmp_path)
    plain = embedded_config(cohort, tmp_path / "run", "redis://x:1/0")
    assert plain.gateway.url is None
    harvest = embedded_config(
        cohort,
        tmp_path / "run",
        "redis://x:1/0",
        overrides={"task": {"name": "chat"}, "rounds.prompt_source": {"kind": "harvest"}},
    )
    assert harvest.gateway.url is not None and harvest.gateway.url.startswith("http://127.0.0.1:")
    named = embedded_config(cohort, tmp_path / "run", "redis://x:1/0", overrides={"gateway.url": "http://gw:8411"})
    assert named.gateway.url == "http://127.0.0.1:8411"
