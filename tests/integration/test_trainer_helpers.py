"""Shared helpers of the trainer tests (no tests here): a cohort config around the tiny model and
graded batches made by really sampling from it, so token ids and log-probs are the model's own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import redis

from corl import redis_keys
from corl.config import CohortConfig, parse_config
from corl.proto import GradedBatch, SamplingSettings
from corl.trainer.testing import batch_from_samples


def make_config(
    tmp: Path, model_dir: Path, redis_url: str, run_id: str, servers: list[str] | None = None, **training: object
) -> CohortConfig:
    return parse_config(
        {
            "run_id": run_id,
            "redis_url": redis_url,
            "weights_dir": str(tmp / "weights"),
            "checkpoints_dir": str(tmp / "checkpoints"),
            "members": [
                {"name": "a", "model": str(model_dir), "servers": servers or ["http://127.0.0.1:9"]},
                {"name": "b", "model": str(model_dir), "servers": ["http://127.0.0.1:9"], "role": "frozen"},
            ],
            "rounds": {"max_tokens": 4, "samples_per_prompt": 4},
            "training": {"max_staleness": 1000, **training},
        }
    )


PROMPTS = ["1+2=", "13+4=", "20+22=", "5+61="]


def make_batches(
    model_dir: Path,
    run_id: str,
    n: int,
    *,
    member: str = "a",
    prompts: int = 4,
    group: int = 4,
    version: int = 0,
    seed: int = 0,
) -> list[GradedBatch]:
    """``n`` batches sampled from the model in ``model_dir``; rewards alternate within each group."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corl.models.sampling import sample

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    batches = []
    for b in range(n):
        texts = [PROMPTS[(b + i) % len(PROMPTS)] for i in range(prompts)]
        results = sample(model, tok, texts, n=group, max_tokens=4, temperature=1.0, seed=seed * 1000 + b)
        batch = batch_from_samples(
            results,
            texts,
            sampling=SamplingSettings(max_tokens=4),
            run_id=run_id,
            member=member,
            round_=b,
            version=version,
            batch_id=f"{run_id}:{b}:{member}",
        )
        batches.append(batch)
    return batches


def xadd(client: redis.Redis, batch: GradedBatch) -> str:
    eid = client.xadd(redis_keys.batches_stream(batch.run_id, batch.member), {"batch": batch.model_dump_json()})
    return eid.decode() if isinstance(eid, bytes) else str(eid)


def pending_count(client: redis.Redis, run_id: str, member: str = "a") -> int:
    return int(client.xpending(redis_keys.batches_stream(run_id, member), redis_keys.TRAINER_GROUP)["pending"])


def applied_ids(client: redis.Redis, run_id: str, member: str = "a") -> set[str]:
    return {x.decode() for x in client.smembers(redis_keys.trainer_applied(run_id, member))}


def start_trainer(config: Path, cmd: list[str]) -> subprocess.Popen[bytes]:
    """``cmd`` (a ``corl train`` of member ``a``, one process or a group) as the chaos tests run it:
    a fixed consumer name, short blocking reads, one thread, its output appended to ``trainer.log``."""
    env = {
        **os.environ,
        "CORL_TRAINER_CONSUMER": "c1",
        "CORL_TRAINER_BLOCK_MS": "100",
        "CORL_TRAINER_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "CORL_LOG_LEVEL": "INFO",
    }
    log = open(config.parent / "trainer.log", "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def published_version(client: redis.Redis, run_id: str, member: str = "a") -> int:
    """The newest weight version the member's trainer recorded in Redis (0: none yet)."""
    v = client.hget(redis_keys.trainer_state(run_id, member), "published_version")
    return int(v) if v else 0
