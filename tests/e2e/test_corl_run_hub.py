"""``corl run --config`` with hub-id members, offline: the members come from a Hugging Face cache this
test builds (``HF_HOME``, ``HF_HUB_OFFLINE=1``; tiny-cohort members saved by transformers in the
snapshot layout, untrained: the random control gives them something to learn), the run trains 2
rounds on the pinned snapshots, the run directory records the commits, and a resume after the branch
moved on keeps training the same snapshots."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hub_cache import add_model, add_ref, commit_of
from run_processes import leftovers

from corl.embedded.processes import corl_command

pytestmark = pytest.mark.slow


def _corl(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(corl_command(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_hub_members_train_on_pinned_snapshots_and_resume_on_the_same(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    add_model(home / "hub", "tiny-org/llama-small", "llama")
    add_model(home / "hub", "tiny-org/gpt2-small", "gpt2")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    env.pop("HF_HUB_CACHE", None)
    config = tmp_path / "hub.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_id": "hub-e2e",
                "members": [
                    {"name": "llama", "model": "tiny-org/llama-small", "servers": ["http://127.0.0.1:1"]},
                    {"name": "gpt2", "model": "tiny-org/gpt2-small@main", "servers": ["http://127.0.0.1:2"]},
                ],
                "rounds": {"prompts_per_round": 4, "samples_per_prompt": 4},
                "reward": {"mode": "random"},
            }
        )
    )
    run_dir = tmp_path / "run"
    args = ["run", "--config", str(config), "--out", str(run_dir), "--rounds", "2"]
    res = _corl(*args, "--eval-every", "1000", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    llama_commit = commit_of("tiny-org/llama-small", "main", "0")
    gpt2_commit = commit_of("tiny-org/gpt2-small", "main", "0")
    pins = json.loads((run_dir / "hub.json").read_text())["models"]
    assert pins["tiny-org/llama-small"]["commit"] == llama_commit
    assert pins["tiny-org/gpt2-small@main"]["commit"] == gpt2_commit
    stored = yaml.safe_load((run_dir / "cohort.yaml").read_text())
    models = {m["name"]: m["model"] for m in stored["members"]}
    assert models["llama"].endswith(f"models--tiny-org--llama-small/snapshots/{llama_commit}")
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert history[-1]["rounds"] >= 2
    assert all(history[-1]["members"][m]["weight_version"] >= 1 for m in ("llama", "gpt2")), history[-1]
    assert leftovers(run_dir) == [], "processes left behind"

    # The branch moves on; the resumed run keeps its pinned commit (a fresh run would take the new one).
    add_model(home / "hub", "tiny-org/gpt2-small", "gpt2", ref="next", seed=1)
    add_ref(home / "hub", "tiny-org/gpt2-small", "main", commit_of("tiny-org/gpt2-small", "next", "1"))
    resumed = _corl("run", "--resume", str(run_dir), "--config", str(config), "--rounds", "3", cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "hub: tiny-org/gpt2-small@main -> " + gpt2_commit[:12] in resumed.stdout
    stored = yaml.safe_load((run_dir / "cohort.yaml").read_text())
    assert {m["name"]: m["model"] for m in stored["members"]}["gpt2"] == models["gpt2"]
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["rounds"] >= 3
    assert leftovers(run_dir) == [], "processes left behind"
