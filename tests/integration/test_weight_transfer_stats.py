"""How each trained member's versions reach its servers (its trainer's record in Redis) shows in the
run's stats and on the dashboard."""

from __future__ import annotations

from test_aggregator import aggregator, make_config, sync_redis

from corl import redis_keys as keys
from corl.proto import DashboardView, RunStats
from corl.services.aggregator.testing import FakeCohort


async def test_the_weight_transfer_shows_in_stats_and_dashboard(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"], frozen=("c",))
    async with aggregator(cfg, FakeCohort.of("a", "b", "c"), redis_url) as (svc, c):
        assert (await svc.driver.run_round()).status == "ok"
        before = RunStats.model_validate((await c.get(f"/v1/runs/{cfg.run_id}/stats")).json())
        r = sync_redis(redis_url)
        r.hset(keys.trainer_state(cfg.run_id, "a"), "weight_transfer", "broadcast")
        r.hset(keys.trainer_state(cfg.run_id, "b"), "weight_transfer", "files")
        stats = RunStats.model_validate((await c.get(f"/v1/runs/{cfg.run_id}/stats")).json())
        view = DashboardView.model_validate((await c.get(f"/v1/runs/{cfg.run_id}/dashboard")).json())
        js = (await c.get("/dashboard/assets/dashboard.js")).text
    assert before.weight_transfer == {}  # no trainer has published yet
    assert stats.weight_transfer == {"a": "broadcast", "b": "files"}
    by = {m.name: m.weight_transfer for m in view.members}
    assert by == {"a": "broadcast", "b": "files", "c": None}
    assert "m.weight_transfer" in js  # the members table shows it beside the version
