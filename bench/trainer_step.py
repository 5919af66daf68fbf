"""Trainer step time and tokens/s on a 16 prompts x 8 samples batch, per tiny-cohort family.

    .venv/bin/python bench/trainer_step.py [--cohort DIR] [--steps 5] [--threads 1] [--out bench/trainer_step.json]

Members come from ``--cohort`` (a built cohort directory, one sub-directory per member) when given,
else they are built with random weights from the ``tiny`` preset (step time does not depend on the
weights). The batch is really sampled from the member (addition prompts, the config's max_tokens),
so its shapes are those of a real round; timing covers advantages, packing, forward, backward,
clipping and the optimizer step (``PolicyTrainer.step``), median over ``--steps`` after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch


def _build_tiny(root: Path) -> dict[str, Path]:
    from transformers import AutoModelForCausalLM

    from corl.cohort.presets import TINY
    from corl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    out = {}
    for spec in TINY.members:
        d = root / spec.name
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(spec.build_config(tok)).save_pretrained(d)
        tok.save_pretrained(d)
        out[spec.name] = d
    return out


def _batch(model_dir: Path, prompts: int, group: int, max_tokens: int):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corl.models.sampling import sample
    from corl.proto import SamplingSettings
    from corl.tasks import get_task
    from corl.trainer.testing import batch_from_samples

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    texts = [e.prompt for e in get_task("addition").splits(0).rl[:prompts]]
    results = sample(model, tok, texts, n=group, max_tokens=max_tokens, temperature=1.0, seed=0)
    return batch_from_samples(results, texts, sampling=SamplingSettings(max_tokens=max_tokens), run_id="bench")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=None, help="Default: the addition task's max_tokens.")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from corl.cohort.loading import parameter_count
    from corl.config import RoundsConfig, parse_config
    from corl.tasks import get_task
    from corl.trainer.policy import PolicyTrainer

    rounds = RoundsConfig()
    max_tokens = args.max_tokens or get_task("addition").max_tokens
    with tempfile.TemporaryDirectory() as tmp:
        dirs = (
            {p.name: p for p in sorted(args.cohort.iterdir()) if (p / "config.json").exists()}
            if args.cohort
            else _build_tiny(Path(tmp))
        )
        rows = []
        for name, d in dirs.items():
            cfg = parse_config(
                {
                    "members": [
                        {"name": "m", "model": str(d), "servers": ["http://x"]},
                        {"name": "n", "model": str(d), "servers": ["http://x"]},
                    ],
                    "rounds": {"max_tokens": max_tokens},
                }
            )
            batch = _batch(d, rounds.prompts_per_round, rounds.samples_per_prompt, max_tokens)
            policy = PolicyTrainer(cfg, "m", torch.device(args.device))
            policy.step(batch)  # warm-up
            stats = [policy.step(batch) for _ in range(args.steps)]
            sec = statistics.median(s.seconds for s in stats)
            row = {
                "member": name,
                "family": policy.model.config.model_type,
                "parameters": parameter_count(policy.model),
                "sequences": stats[0].sequences,
                "tokens": stats[0].tokens,
                "step_seconds": round(sec, 4),
                "tokens_per_second": round(stats[0].tokens / sec, 1),
                "threads": args.threads,
                "device": args.device,
            }
            rows.append(row)
            print(json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
