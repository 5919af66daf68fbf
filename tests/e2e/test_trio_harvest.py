"""The free-form chat task with ``peer_judge`` end to end on the real three-family cohort, through the
gateway: agents' conversations are harvested, every member answers them (each with its own chat or plain
template), the peers judge each answer against the config's rubric (``Y``/``N`` from their own token
probabilities), and members train and publish versions. A few rounds at CI size."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from run_processes import wait_ready

from corl.embedded.processes import corl_command
from corl.redis_server import free_port

# The three real members load, then sample, judge and train three rounds on 2 cores while the agents
# talk: 5 minutes alone on the 2-core machine (295 s), more beside other work: past the default limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "e2e-trio-harvest-token-0123456789"
RUBRIC = "The response gives the sum the user asks for, correctly, and nothing else."


def test_chat_peer_judge_on_the_trio_through_the_gateway(trio_cohort: Path, tmp_path: Path) -> None:
    arith = yaml.safe_load((ROOT / "examples" / "trio-arith.yaml").read_text())
    gateway_port = free_port()
    cfg = {
        "run_id": "trio-harvest",
        "task": {"name": "chat", "rubric": RUBRIC},
        "members": [
            {"name": m["name"], "model": str(trio_cohort / m["name"]), "servers": ["http://x"]}
            for m in arith["members"]
        ],  # fmt: skip
        "rounds": {
            "prompts_per_round": 2,
            "samples_per_prompt": 4,
            "max_tokens": 32,
            "prompt_source": {"kind": "harvest", "min_prompts": 2},
            "max_pending_batches": 1,
            "request_timeout_s": 600,
        },
        "reward": {"mode": "peer_judge", "judge": {"k": 2}},
        "training": arith["training"],
        "gateway": {"url": f"http://127.0.0.1:{gateway_port}", "harvest": {"routes": ["chat"]}},
    }
    config, run_dir = tmp_path / "trio-harvest.yaml", tmp_path / "run"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "CORL_COHORT_TOKEN": TOKEN}
    run_log = (tmp_path / "run.log").open("w")  # a file: a pipe nobody reads for minutes would fill and block
    run = subprocess.Popen(
        corl_command("run", "--config", str(config), "--rounds", "50", "--out", str(run_dir)),
        env=env,
        stdout=run_log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    gateway = f"http://127.0.0.1:{gateway_port}"
    app: subprocess.Popen[str] | None = None
    app_out = ""
    try:
        wait_ready(gateway, run, 900)
        # The agents talk for as long as the run trains: a round takes the newest conversations only.
        app = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "harvest_agents.py"), "--base-url", f"{gateway}/v1"]
            + ["--seconds", "1500", "--support-model", "smollm2", "--ops-model", "qwen25"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 1200  # three rounds of real-model sampling, judging and training
        while time.monotonic() < deadline and run.poll() is None and app.poll() is None:
            rounds = (run_dir / "rounds.jsonl").read_text().splitlines() if (run_dir / "rounds.jsonl").exists() else []
            if len(rounds) >= 3 and all(list((run_dir / "weights" / m).glob("v*")) for m in ("smollm2", "qwen25")):
                break
            time.sleep(5)
        app.send_signal(signal.SIGTERM)  # each agent ends after its current request, then the summary
        app_out, _ = app.communicate(timeout=300)
    finally:
        if app is not None and app.poll() is None:
            app.kill()
        run.send_signal(signal.SIGINT)
        run.wait(timeout=300)
        run_log.close()
    out = (tmp_path / "run.log").read_text()
    assert re.search(r"RESULT requests=[1-9]\d* failed=0$", app_out.strip()), app_out[-2000:]
    rounds_stats = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds_stats) >= 3, out[-3000:]
    assert all(r["harvested"] for r in rounds_stats)  # every round's prompts came from the gateway
    for r in rounds_stats:  # peer_judge: rewards are judges' scores, not all equal
        assert any(m["mean_reward"] not in (0.0, 1.0) for m in r["members"].values()), r
    logs = run_dir / "logs"
    for m in ("smollm2", "qwen25"):
        assert list((run_dir / "weights" / m).glob("v*")), f"{m} published no version"
        assert re.search(r'"POST /v1/weights(?:/broadcast)? HTTP/1\.1" 200', (logs / f"server-{m}-0.log").read_text())
    # The judges read the rubric: every member served the chat task's judge requests.
    for m in ("smollm2", "gemma3", "qwen25"):
        assert '"POST /v1/grade HTTP/1.1" 200' in (logs / f"server-{m}-0.log").read_text(), m
