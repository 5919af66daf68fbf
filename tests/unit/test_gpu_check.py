"""``bench/gpu_check.sh`` without a GPU: it parses (and passes shellcheck where installed), skips
cleanly with exit 0 on a machine whose ``nvidia-smi`` lists no GPU, lists the steps it would run on one
and on two GPUs (a fake ``nvidia-smi``, dry run), and its Python pieces cut the example down to a run
that the planner fits on one GPU and read a finished run's directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from corl.config import parse_config
from corl.placement import plan

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "bench"))

from gpu_check import check_run, short_config  # noqa: E402


def _fake_smi(tmp_path: Path, gpus: int) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})"\n' for i in range(gpus))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nif [ "$1" = "-L" ]; then\n{lines}:\nelse echo "NVIDIA H100 80GB HBM3"; fi\n')
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CORL_GPU_CHECK_DIR": str(tmp_path / "work")}


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_the_script_parses_and_passes_shellcheck() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        res = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def test_without_a_gpu_it_skips_cleanly(tmp_path: Path) -> None:
    res = _check(_fake_smi(tmp_path, 0))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "RESULT gpu_check status=skipped reason=no-cuda-device" in res.stdout
    assert "=== install" not in res.stdout  # nothing was installed


@pytest.mark.parametrize("gpus", [1, 2])
def test_on_a_gpu_node_it_runs_every_step(tmp_path: Path, gpus: int) -> None:
    env = {**_fake_smi(tmp_path, gpus), "CORL_GPU_CHECK_DRY_RUN": "1"}
    res = _check(env)
    assert res.returncode == 0, res.stdout + res.stderr
    steps = [
        line.split()[1].removeprefix("step=")
        for line in res.stdout.splitlines()
        if line.startswith("RESULT step=") and "status=dry-run" in line
    ]
    expected = ["install", "vllm_tests", "member", "bench_vllm", "bench_serving", "config", "plan"]
    expected += ["cohort_run", "cohort_run_check"] + (["nccl_group"] if gpus == 2 else [])
    assert steps == expected
    assert ("RESULT step=nccl_group status=skip reason=one-gpu" in res.stdout) == (gpus == 1)
    assert f"RESULT gpu_check status=dry-run failures=0 gpus={gpus}" in res.stdout
    assert "-m vllm tests/vllm_backend" in res.stdout and ("-m gpu tests/gpu" in res.stdout) == (gpus == 2)
    recorded = (tmp_path / "work" / "results.txt").read_text()
    assert recorded.count("RESULT ") == res.stdout.count("RESULT ")


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_the_short_run_fits_the_node(gpus: int) -> None:
    example = yaml.safe_load((ROOT / "examples" / "gpu-node.yaml").read_text())
    cfg = parse_config(short_config(example, gpus))
    p = plan(cfg, [str(i) for i in range(gpus)])
    assert p.fits, p.problems
    assert all(s.devices for s in p.slots), "every server and trainer of the check runs on a GPU"
    assert cfg.rounds.prompts_per_round == 4 and cfg.task.source == example["task"]["source"]


def test_check_run_reads_a_finished_run(tmp_path: Path) -> None:
    snapshot = {"rounds": 3, "elapsed_s": 42.0, "members": {"a": {"weight_version": 3}, "b": {"weight_version": 2}}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(snapshot) + "\n")
    (tmp_path / "placement.json").write_text(json.dumps({"slots": [{"process": "server-a-0", "devices": ["0"]}]}))
    (tmp_path / "hub.json").write_text(json.dumps({"models": {"org/a": {}, "org/b": {}}}))
    line = check_run(tmp_path, 3)
    assert line.startswith("RESULT rounds=3 seconds=42 on_gpu=1 pinned=2")
    with pytest.raises(AssertionError, match="2 rounds of 3"):
        (tmp_path / "metrics.jsonl").write_text(json.dumps({**snapshot, "rounds": 2}) + "\n")
        check_run(tmp_path, 3)
