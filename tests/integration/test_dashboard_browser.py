"""The dashboard in headless Chromium (Debian's ``chromium``): a real aggregator on loopback runs
rounds on fake members, the page loads its vendored uPlot, polls the run and draws every chart.
A screenshot lands in ``$CORL_TEST_ARTIFACTS`` (default: the test's tmp dir)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_aggregator import serve
from test_aggregator import ADMIN, make_config, sync_redis

from corl import redis_keys as keys
from corl.proto import HeldoutAccuracy
from corl.services.aggregator import AggregatorSettings, create_app
from corl.services.aggregator.testing import FakeCohort, FakeMember

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)"),
]
ROUNDS = 12


@pytest.fixture
def live_aggregator(redis_url: str) -> Iterator[tuple[str, str]]:
    cfg = make_config(["smollm", "gemma", "qwen"], frozen=("qwen",), max_rounds=ROUNDS)
    fake = FakeCohort(
        {
            "smollm": FakeMember("smollm", accuracy=0.85, weight_version=ROUNDS),
            "gemma": FakeMember("gemma", accuracy=0.6, weight_version=ROUNDS - 1),
            "qwen": FakeMember("qwen", accuracy=0.4),
        }
    )
    settings = AggregatorSettings(
        config=Path("/nonexistent.yaml"), redis_url=redis_url, admin_token=ADMIN, backpressure_poll_s=0.05
    )  # type: ignore[call-arg]
    app = create_app(settings, config=cfg, transport=fake.transport())
    with serve(app) as url:
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/runs/{cfg.run_id}/stats", timeout=5).json()["next_round"] < ROUNDS:
            assert time.monotonic() < deadline, f"the aggregator did not run {ROUNDS} rounds"
            time.sleep(0.2)
        grader = {"name": "outside-judge", "mode": "pull"}
        auth = {"Authorization": f"Bearer {ADMIN}"}
        assert httpx.post(f"{url}/v1/graders", json=grader, headers=auth, timeout=5).status_code == 201
        rec = {"smollm": (0.81, ROUNDS), "gemma": (0.55, ROUNDS - 1)}
        r = sync_redis(redis_url)
        for m, (acc, ver) in rec.items():
            reading = HeldoutAccuracy(accuracy=acc, weight_version=ver, at=time.time())  # as the evaluator writes it
            r.hset(keys.heldout_accuracy(cfg.run_id), m, reading.model_dump_json())
        yield url, cfg.run_id


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    return subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, check=False)


def test_dashboard_renders_charts_with_data_from_a_run(live_aggregator: tuple[str, str], tmp_path: Path) -> None:
    url, run_id = live_aggregator
    page = f"{url}/dashboard"
    dom = chromium("--virtual-time-budget=6000", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html: Any = dom.stdout
    assert 'data-status="live"' in html, html[:2000]
    assert f'data-rounds="{ROUNDS}"' in html
    # Five uPlot charts drew (each a canvas in a .uplot root), one line per member.
    assert len(re.findall(r'class="uplot', html)) == 5 and html.count("<canvas") >= 5
    for member in ("smollm", "gemma", "qwen"):
        assert f'data-member="{member}"' in html
    assert ">v12<" in html and "0.810 (v12)" in html  # weight version and held-out accuracy from the run
    assert run_id in html and "outside-judge" in html  # the grading pool's table

    out = Path(os.environ.get("CORL_TEST_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    shot = out / "dashboard.png"
    res = chromium("--virtual-time-budget=6000", "--window-size=1280,1280", f"--screenshot={shot}", page)
    assert res.returncode == 0 and shot.is_file() and shot.stat().st_size > 20_000, res.stderr[-2000:]
