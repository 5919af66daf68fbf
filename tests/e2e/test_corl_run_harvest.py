"""Issue 36 end to end: a test app (two scripted ``openai`` agents, one talking to a trained member, one to an
outside endpoint member, both through the gateway) drives traffic while ``corl run`` trains on what the
gateway harvests. The app sees no failed request while trained members publish and hot-swap versions;
the prompts trained on are exactly conversations the policy admits (route, members, size bound,
redaction, sampling); no redacted string reaches Redis, the run directory or the logs.

The micro members rarely agree, so rewards are ``self_vote`` (as in test_corl_run.py): this checks the
loop, not what the members learn. The outside endpoint is a ``corl serve model`` started apart from the
run (any OpenAI-compatible server would do)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from run_processes import leftovers, wait_ready

from corl.config import load_config
from corl.embedded.processes import corl_command
from corl.harvest import Redactor, conversation_of, entry_id, too_large
from corl.proto.gateway import HarvestStats
from corl.redis_server import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "e2e-harvest-cohort-token-0123456789"
SECRETS = ["sk-live-a1b2c3", "sk-live-x9y8z7", "me@x.io"]  # what examples/harvest_agents.py pastes in


def harvest_config(cohort: Path, path: Path, ops_port: int, gateway_port: int) -> Path:
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "harvest-tiny.yaml").read_text())
    cfg["members"] = [
        {"name": "gpt2", "model": str(cohort / "gpt2"), "servers": ["http://unassigned"]},
        {"name": "llama", "model": str(cohort / "llama"), "servers": ["http://unassigned"]},
        {"name": "ops", "endpoint": {"base_url": f"http://127.0.0.1:{ops_port}/v1", "model": "ops"}},
    ]
    cfg["reward"] = {"mode": "self_vote"}
    cfg["gateway"]["url"] = f"http://127.0.0.1:{gateway_port}"
    path.write_text(yaml.safe_dump(cfg))
    return path


def admissible_ids(sent: list[dict[str, Any]], cfg_path: Path) -> tuple[set[str], int]:
    """Pool ids of the answered requests the policy admits (before sampling), and how many there were."""
    policy = load_config(cfg_path).gateway.harvest
    redact = Redactor(policy.redact)
    ids, n = set(), 0
    for r in sent:
        if not r["ok"] or r["route"] not in policy.routes or r["model"] not in (policy.members or [r["model"]]):
            continue
        conv = conversation_of("chat", json.dumps({"model": r["model"], "messages": r["messages"]}).encode())
        assert conv is not None
        if too_large(policy, conv):
            continue
        n += 1
        ids.add(entry_id(redact(conv)[0]))
    return ids, n


def test_agents_traffic_is_harvested_and_trained_on(cohort: Path, tmp_path: Path) -> None:
    run_dir, ops_port, gateway_port = tmp_path / "run", free_port(), free_port()
    cfg_path = harvest_config(cohort, tmp_path / "harvest.yaml", ops_port, gateway_port)
    env = {**os.environ, "CORL_COHORT_TOKEN": TOKEN}
    ops_env = {k: v for k, v in os.environ.items() if k != "CORL_COHORT_TOKEN"}  # an outside server, its own rules
    serve_ops = corl_command(
        "serve", "model", "--model", str(cohort / "gpt2"), "--name", "ops", "--port", str(ops_port)
    )
    ops = subprocess.Popen(serve_ops, env=ops_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    run = subprocess.Popen(
        corl_command("run", "--config", str(cfg_path), "--rounds", "500", "--out", str(run_dir), "--eval-every", "5"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    gateway = f"http://127.0.0.1:{gateway_port}"
    try:
        wait_ready(f"http://127.0.0.1:{ops_port}", ops)
        wait_ready(gateway, run)
        app = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "harvest_agents.py"), "--base-url", f"{gateway}/v1"]
            + ["--seconds", "60", "--out", str(tmp_path / "sent.jsonl")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        stats = HarvestStats.model_validate_json(
            httpx.get(f"{gateway}/v1/harvest/stats", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).content
        )
        deadline = time.monotonic() + 120  # the last harvested prompts' rounds
        while time.monotonic() < deadline and (len(list((run_dir / "weights").glob("*/v*"))) < 4):
            time.sleep(1)
    finally:
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=180)
        ops.terminate()
        ops.wait(30)

    # The app: every request answered, through swaps.
    assert app.returncode == 0 and app.stdout.strip().endswith("failed=0"), app.stdout[-2000:] + app.stderr[-2000:]
    sent = [json.loads(line) for line in (tmp_path / "sent.jsonl").read_text().splitlines()]
    assert {r["agent"] for r in sent} == {"support", "ops"} and len(sent) > 100

    # Trained members published versions and their servers swapped them in.
    for member in ("gpt2", "llama"):
        assert len(list((run_dir / "weights" / member).glob("v*"))) >= 2, member
        log = (run_dir / "logs" / f"server-{member}-0.log").read_text()
        swaps = re.findall(r'"POST /v1/weights(?:/broadcast)? HTTP/1.1" 200', log)  # from files or a broadcast
        assert len(swaps) >= 2, member

    # Trained on: harvested conversations only, each one the policy admits (redacted form).
    admitted, n_admitted = admissible_ids(sent, cfg_path)
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    trained = [i for r in rounds for i in r["harvested"]]
    assert len(rounds) >= 3 and trained and all(len(r["harvested"]) >= 4 for r in rounds)  # min_prompts
    assert set(trained) <= admitted, set(trained) - admitted
    assert len(trained) == len(set(trained))  # each taken once
    # Sampling: about half of what was admitted (less the duplicates a short sum repeats).
    assert 0.3 * n_admitted <= stats.harvested + stats.dropped.get("duplicate", 0) <= 0.7 * n_admitted, stats
    assert stats.dropped.get("too_large", 0) > 0 and stats.redacted > 0
    assert 0 < stats.trained_on and not {"pool_down", "queue_full"} & set(stats.dropped)

    # No redacted string anywhere: Redis's append-only file, the logs, the run's records, corl run's output.
    for path in [p for p in run_dir.rglob("*") if p.is_file()]:
        data = path.read_bytes()
        leaked = [s for s in SECRETS if s.encode() in data]
        assert not leaked, f"{path}: {leaked}"
    assert not any(s in out for s in SECRETS)
    assert b"[REDACTED]" in (run_dir / "redis" / "appendonly.aof").read_bytes()  # what was stored instead
    assert leftovers(run_dir) == [], "processes left behind"
