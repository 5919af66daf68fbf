"""The Python pieces of ``bench/gpu_check.sh`` (testable without a GPU):

    python bench/gpu_check.py config SOURCE TARGET GPUS   # the short cohort run's config
    python bench/gpu_check.py check-run RUN_DIR ROUNDS    # did that run do what it should

``config`` takes a cohort config (default ``examples/gpu-node.yaml``) down to a few small rounds; on a
one-GPU node it drops the members' ``gpus:`` asks so that the planner shares the GPU among every
process. ``check-run`` reads the run directory: its rounds, its device plan (some process on a GPU) and
its hub pins, and prints them as a ``RESULT`` line; it fails when the run fell short.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def short_config(cfg: dict[str, Any], gpus: int) -> dict[str, Any]:
    cfg = json.loads(json.dumps(cfg))  # a deep copy
    cfg["run_id"] = "gpu-check"
    cfg.setdefault("task", {})["eval_size"] = 20
    cfg.setdefault("rounds", {}).update(prompts_per_round=4, samples_per_prompt=4, max_tokens=128)
    if gpus < 2:
        for member in cfg["members"]:
            member.pop("gpus", None)
            member.pop("trainer", None)
    return cfg


def check_run(run: Path, rounds: int) -> str:
    """The RESULT line of a finished run; ``AssertionError`` when it fell short."""
    history = (run / "metrics.jsonl").read_text().splitlines()
    assert history, f"{run}: no snapshot in metrics.jsonl"
    last = json.loads(history[-1])
    assert last["rounds"] >= rounds, f"{last['rounds']} rounds of {rounds}"
    plan = json.loads((run / "placement.json").read_text())
    on_gpu = [s["process"] for s in plan["slots"] if s["devices"]]
    assert on_gpu, "no process was placed on a GPU"
    pins = json.loads((run / "hub.json").read_text())["models"] if (run / "hub.json").exists() else {}
    versions = {name: m["weight_version"] for name, m in last["members"].items()}
    assert any(v and v > 0 for v in versions.values()), f"no member served a trained version: {versions}"
    return (
        f"RESULT rounds={last['rounds']} seconds={last['elapsed_s']:.0f} on_gpu={len(on_gpu)} pinned={len(pins)} "
        f"versions={json.dumps(versions, separators=(',', ':'))}"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["config"] and len(argv) == 4:
        source, target, gpus = Path(argv[1]), Path(argv[2]), int(argv[3])
        cfg = short_config(yaml.safe_load(source.read_text()), gpus)
        target.write_text(yaml.safe_dump(cfg, sort_keys=False))
        print(f"RESULT config={target} members={len(cfg['members'])}")
        return 0
    if argv[:1] == ["check-run"] and len(argv) == 3:
        print(check_run(Path(argv[1]), int(argv[2])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
