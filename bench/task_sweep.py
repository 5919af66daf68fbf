"""Greedy accuracy and formatted share of members on many task variants, each member loaded once.

    python bench/task_sweep.py CANDIDATES.json MEMBER_DIR [MEMBER_DIR ...] [--n 48] [--out FILE.json]

``CANDIDATES.json`` maps a name to a ``task:`` section (the cohort config's TaskConfig, e.g. a
``gym:basic_arithmetic`` source with its options). For each member, in turn, and each variant: the
first ``--n`` held-out problems, rendered as a model server renders them, answered greedily with the
task's stop strings and token budget (24), read with the task's reader. A quick way to look over many
variants before reading the few that matter with ``corl eval --config`` (greedy, maj@k and
formatted share through the servers), which is what docs/RESULTS.md quotes as a task's start.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from corl.cohort.loading import load_member
from corl.config import TaskConfig
from corl.data import load_splits
from corl.models.sampling import sample
from corl.services.model.rendering import PromptRenderer
from corl.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("candidates", type=Path)
    ap.add_argument("members", type=Path, nargs="+")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    variants = {name: TaskConfig(**spec) for name, spec in json.loads(args.candidates.read_text()).items()}
    rows = []
    for member in args.members:
        model, tokenizer = load_member(member, device="cpu")
        renderer = PromptRenderer(tokenizer)
        for name, tc in variants.items():
            task = get_task(tc.name)
            examples = load_splits(tc, 0).eval[: args.n]
            t0 = time.perf_counter()
            out = sample(
                model,
                tokenizer,
                [renderer.render(e.prompt, task.prompt_format) for e in examples],
                n=1,
                max_tokens=24,
                temperature=0.0,
                stop=task.stop,
            )
            texts = [r.completions[0].text for r in out]
            right = sum(task.extract_answer(e.prompt, t) == e.answer for e, t in zip(examples, texts, strict=True))
            formatted = sum(task.is_formatted(e.prompt, t) for e, t in zip(examples, texts, strict=True))
            row = {
                "member": member.name,
                "variant": name,
                "n": len(examples),
                "greedy": right / len(examples),
                "formatted": formatted / len(examples),
                "seconds": round(time.perf_counter() - t0, 1),
                "first": texts[0],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
