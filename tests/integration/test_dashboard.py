"""The live dashboard: the page and its vendored assets are served by the aggregator (no CDN), and
the JSON it polls carries every field the page shows, from real rounds on fake members."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import httpx
from test_aggregator import aggregator, make_config, sync_redis

from corl import redis_keys as keys
from corl.embedded.run import RunMonitor, RunOptions, service_urls
from corl.proto import DashboardView, ErrorResponse, HeldoutAccuracy
from corl.services.aggregator.dashboard import UPLOT_SHA256
from corl.services.aggregator.testing import FakeCohort

STATIC = Path(__file__).resolve().parents[2] / "services" / "aggregator" / "static"


async def test_page_and_assets_are_served_from_the_package(redis_url: str) -> None:
    cfg = make_config(["a", "b"])
    async with aggregator(cfg, FakeCohort.of("a", "b"), redis_url) as (_, c):
        page = await c.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        html = page.text
        assert f"window.CORL_RUN = {json.dumps(cfg.run_id)};" in html
        refs = re.findall(r'(?:src|href)="(dashboard/assets/[^"]+)"', html)
        assert {"dashboard/assets/uPlot.iife.min.js", "dashboard/assets/uPlot.min.css"} <= set(refs)
        assert not re.search(r'(?:src|href)="(?:https?:)?//', html), "the page must not load anything from a CDN"
        for ref in refs:
            r = await c.get("/" + ref)
            assert r.status_code == 200, ref
            assert r.content == (STATIC / ref.rsplit("/", 1)[1]).read_bytes()
        js = await c.get("/dashboard/assets/uPlot.iife.min.js")
        assert js.headers["content-type"].startswith("text/javascript") and b"uPlot" in js.content
        own = (await c.get("/dashboard/assets/dashboard.js")).text
        assert 'v1/runs/" + encodeURIComponent(RUN) + "/dashboard' in own
        missing = await c.get("/dashboard/assets/..%2Fapp.py")
    assert missing.status_code == 404 and ErrorResponse.model_validate(missing.json()).error.type == "not_found"
    assert "MIT License" in (STATIC / "uPlot.LICENSE").read_text()
    # The chart library is pinned: the vendored bytes are the ones of uPlot 1.6.32 on npm.
    for name, digest in UPLOT_SHA256.items():
        assert hashlib.sha256((STATIC / name).read_bytes()).hexdigest() == digest, name
    assert (STATIC / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


async def test_dashboard_json_has_what_the_page_shows(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"], frozen=("c",))
    fake = FakeCohort.of("a", "b", "c")
    fake.members["a"].weight_version = 7
    fake.down.add("c")
    async with aggregator(cfg, fake, redis_url, http={"attempts": 1}) as (svc, c):
        for _ in range(2):
            assert (await svc.driver.run_round()).status == "ok"
        before = DashboardView.model_validate((await c.get(f"/v1/runs/{cfg.run_id}/dashboard")).json())
        assert (await svc.driver.run_round()).status == "ok"
        # The run's evaluator (here corl run's monitor) reports held-out accuracy through Redis.
        monitor = RunMonitor(cfg.model_copy(update={"redis_url": redis_url}), "http://unused", RunOptions())
        try:
            monitor.report_heldout("a", HeldoutAccuracy(accuracy=0.625, weight_version=7, at=time.time()))
        finally:
            monitor.close()
        r = await c.get(f"/v1/runs/{cfg.run_id}/dashboard")
        other = await c.get("/v1/runs/nope/dashboard")
    assert r.status_code == 200, r.text
    view = DashboardView.model_validate(r.json())
    # The view follows the run: the poll after one more round has it.
    assert (before.next_round, len(before.rounds)) == (2, 2) and view.updated_at >= before.updated_at
    assert view.run_id == cfg.run_id and view.next_round == 3 and [x.round for x in view.rounds] == [0, 1, 2]
    by = {m.name: m for m in view.members}
    assert list(by) == ["a", "b", "c"]
    a, b, frozen = by["a"], by["b"], by["c"]
    assert (a.weight_version, b.weight_version, frozen.weight_version) == (7, 0, None)  # c is down
    assert a.heldout_accuracy == 0.625 and a.heldout_version == 7 and b.heldout_accuracy is None
    assert a.backlog == 3 and b.backlog == 3 and frozen.backlog is None  # no trainer read the 3 batches
    assert a.mean_reward is not None and 0.0 <= a.mean_reward <= 1.0 and a.label_rate is not None
    assert a.distinct_answers is not None and frozen.mean_reward is None  # c missed the last round
    assert set(view.grader_weights) >= {"a", "b", "c"} and view.quarantined == [] and view.collapse == []
    assert other.status_code == 404
    ttl = sync_redis(redis_url).ttl(keys.heldout_accuracy(cfg.run_id))
    assert ttl > 0  # every non-durable key has a TTL


def test_corl_run_prints_the_dashboard_and_aggregator_urls() -> None:
    text = service_urls("http://127.0.0.1:8123")
    assert "http://127.0.0.1:8123/dashboard" in text
    assert re.search(r"aggregator: http://127\.0\.0\.1:8123\b", text)
    assert httpx.URL("http://127.0.0.1:8123/dashboard").path == "/dashboard"
