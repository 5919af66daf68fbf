"""The real cohorts through ``corl run``: the smol example configs (GSM8K math, HumanEval code) run
2 rounds through the real services, the three-family study config 3. Members render with their own
templates (SmolLM2's and Qwen's chat templates, Gemma's plain template), get rewards, train (LoRA,
micro-batched), publish and hot-swap, and the run's held-out readings come through the servers."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from corl.embedded.processes import corl_command

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROUNDS = 2


def small_config(example: str, cohort: Path, out: Path, samples: int = 4, max_tokens: int | None = 48) -> Path:
    """The example config with CI-sized rounds: 2 prompts x ``samples``, short generations, 4 held out."""
    cfg = yaml.safe_load((EXAMPLES / example).read_text())
    for m in cfg["members"]:
        m["model"] = str(cohort / m["name"])
    cfg["task"]["eval_size"] = 4
    cfg["rounds"].update(prompts_per_round=2, samples_per_prompt=samples)
    if max_tokens is not None:
        cfg["rounds"]["max_tokens"] = max_tokens
    path = out / example
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("example", ["smol-gsm8k.yaml", "smol-humaneval.yaml"])
def test_real_cohort_runs_two_rounds_through_the_services(example: str, smol_cohort: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = small_config(example, smol_cohort, tmp_path)
    res = subprocess.run(
        corl_command("run", "--config", str(config), "--rounds", str(ROUNDS), "--out", str(run_dir)),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = history[-1]
    assert final["rounds"] >= ROUNDS
    logs = run_dir / "logs"
    assert "use the tokenizer's chat template" in (logs / "server-smollm2-0.log").read_text()
    assert (
        "no chat template: every prompt uses the task's plain template after the BOS token '<bos>'"
        in (logs / "server-gemma3-0.log").read_text()
    )
    rewarded = [r["members"][m]["mean_reward"] for r in history for m in ("smollm2", "gemma3")]
    assert any(v is not None for v in rewarded), "no round reported peer rewards"
    for m in ("smollm2", "gemma3"):
        trainer_log = (logs / f"trainer-{m}.log").read_text()
        for step in range(1, ROUNDS + 1):  # each round's batch reached the member's trainer and was applied
            assert re.search(rf"step {step} batch \S+-r\d+-{m}: ", trainer_log), f"{m}: no step {step}"
        # A batch whose groups all tie carries no signal and publishes nothing; every update that was
        # published is served: the server swapped to each version and reports the newest.
        published = sorted((run_dir / "weights" / m).glob("v*"), key=lambda p: int(p.name[1:]))
        server_log = (logs / f"server-{m}-0.log").read_text()
        assert len(re.findall(r'"POST /v1/weights(?:/broadcast)? HTTP/1.1" 200', server_log)) == len(published), m
        assert final["members"][m]["weight_version"] == (int(published[-1].name[1:]) if published else 0)
        assert all((p / "adapter_model.safetensors").exists() for p in published)  # LoRA: the adapter is swapped
        assert final["members"][m]["accuracy"] is not None  # held-out pass@1 read through the server


def test_three_family_cohort_runs_three_rounds_and_every_member_hot_swaps(trio_cohort: Path, tmp_path: Path) -> None:
    """The study's config (``examples/trio-arith.yaml``: three families, per-member learning rates)
    at CI size, with ground-truth rewards so that a group of mixed answers always carries signal."""
    run_dir = tmp_path / "run"
    config = small_config("trio-arith.yaml", trio_cohort, tmp_path, samples=8, max_tokens=None)
    res = subprocess.run(
        corl_command(
            "run", "--config", str(config), "--rounds", "3", "--reward", "ground_truth", "--out", str(run_dir)
        ),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    logs = run_dir / "logs"
    for m in ("smollm2", "gemma3", "qwen25"):
        published = sorted((run_dir / "weights" / m).glob("v*"), key=lambda p: int(p.name[1:]))
        assert published, f"{m}: no version published in 3 rounds"
        server_log = (logs / f"server-{m}-0.log").read_text()
        assert len(re.findall(r'"POST /v1/weights(?:/broadcast)? HTTP/1.1" 200', server_log)) == len(published), m
        assert final["members"][m]["weight_version"] == int(published[-1].name[1:]), m
        assert final["members"][m]["accuracy"] is not None
