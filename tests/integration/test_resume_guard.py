"""A run whose Redis still runs (its supervisor was killed alone) is not resumed: a second Redis on
the same append-only file would corrupt it. Another Redis at that address is no obstacle."""

from __future__ import annotations

from pathlib import Path

import pytest

from corl.config import parse_config
from corl.embedded.resume import ResumeRefused, check_resumable
from corl.redis_server import LocalRedis

MEMBERS = [{"name": n, "model": f"/m/{n}", "servers": ["http://127.0.0.1:1"]} for n in ("a", "b")]


def test_a_run_whose_redis_still_serves_its_directory_is_not_resumed(tmp_path: Path, redis_url: str) -> None:
    run_dir = tmp_path / "run"
    with LocalRedis(data_dir=run_dir / "redis") as left_running:
        stored = parse_config({"members": MEMBERS, "redis_url": left_running.url})
        with pytest.raises(ResumeRefused, match="is still running"):
            check_resumable(run_dir, stored, stored)
    check_resumable(run_dir, stored, stored)  # stopped: resumable
    elsewhere = stored.model_copy(update={"redis_url": redis_url})  # a Redis serving another directory
    check_resumable(run_dir, elsewhere, elsewhere)
