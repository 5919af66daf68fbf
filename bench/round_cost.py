"""Where a round of a real cohort goes, per member and phase, in one process on one thread.

    .venv/bin/python bench/round_cost.py [--config examples/trio-arith.yaml] [--rounds 3] [--before]
        [--out bench/round_cost.json]

Per member of ``--config`` (the study's cohort, task and round size), ``--rounds`` times on fresh
RL prompts, each phase with the code the services run:

- **sampling**: ``corl.models.sampling.sample`` on the prompts as the member's server renders them
  (``PromptRenderer``: chat template or the task's plain template), ``prompts_per_round`` x
  ``samples_per_prompt`` at the config's temperature, top-p, stop strings and max_tokens;
- **grading**: the task's answer reading and check on every sample (ground-truth rewards here: the
  cost of a peer mode's vote is the same reading);
- **log-probs**: the trainer's forward over the packed batch without gradient (``response_logps``,
  what the loss recomputes), and **step**: ``PolicyTrainer.step`` (forward, backward, clip,
  optimizer; the log-probs are inside it, so a round counts the step and not them); backward ~
  step - log-probs;
- **publish**: ``WeightsStore.save`` of the trained weights (LoRA adapter or full), with its sha256;
- **swap**: ``TransformersBackend``'s weight load into its spare slot, checksum included (the
  first LoRA swap, which also reads the targeted initial weights once, is reported apart), beside
  a **raw load** (``from_pretrained`` of the member's model directory, every weight read) for scale.

Processes of a real run share the machine's cores, so a round's wall time is about the sum of these
CPU costs over the cores. ``--before`` runs the code paths this bench was written to remove:
sampling through ``model.generate`` (every prompt prefilled once per sample, ended rows decoded to
the longest), one trainer forward over every row's prompt (no prompt shared by a group's samples),
the LM head over every position in the trainer (no ``logits_to_keep``), every micro-batch padded to
the batch's longest answer (not cut to its own) and the LoRA swap through
PEFT after a reset of every weight from the parsed checkpoint.
Rewards are ground truth, made to carry signal in every group (``_reward``) so that every step trains.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch


@contextlib.contextmanager
def _before() -> Iterator[None]:
    """The pre-optimisation paths (see the module docstring), by patching their switches."""
    from corl.models import sampling
    from corl.services.model.backends.transformers import TransformersBackend
    from corl.trainer import losses, policy

    real, shares = losses._accepts, losses.shares_prompts
    cut = policy._micro_batches
    saved = sampling.DynamicLayer
    merge = TransformersBackend._load_lora
    sampling.DynamicLayer = type("NoCacheQualifies", (), {})  # type: ignore[misc,assignment]
    losses._accepts = lambda model, name: name != "logits_to_keep" and real(model, name)  # type: ignore[assignment]
    losses.shares_prompts = lambda model: False  # type: ignore[assignment]
    policy._micro_batches = lambda mask, size: [  # type: ignore[assignment]
        (slice(i, min(i + size, mask.size(0))), mask.size(1)) for i in range(0, mask.size(0), size)
    ]
    TransformersBackend._load_lora = _peft_merge  # type: ignore[method-assign]
    try:
        yield
    finally:
        sampling.DynamicLayer = saved  # type: ignore[misc]
        losses._accepts, losses.shares_prompts = real, shares  # type: ignore[assignment]
        policy._micro_batches = cut  # type: ignore[assignment]
        TransformersBackend._load_lora = merge  # type: ignore[method-assign]


@torch.no_grad()
def _peft_merge(self, slot, path: str, sha256: str):  # type: ignore[no-untyped-def]
    """The LoRA swap before: every weight reset from the parsed checkpoint, then PEFT wraps the
    spare, merges and unwraps it."""
    from peft import PeftModel

    from corl import weights_store
    from corl.services.model.backends import weights

    weights.verify_adapter(path, sha256)
    for name, tensor in self._parse(weights_store.safetensors_files(self._model_dir)).items():
        slot.targets[name].copy_(tensor)
    return PeftModel.from_pretrained(slot.model, path).merge_and_unload().eval()


def _reward(correct: list[bool], p: int, j: int, g: int) -> float:
    """Ground truth, except in a group whose answers are all right or all wrong, where samples
    alternate 0/1: such a group would be skipped, and a step's cost does not depend on the values."""
    group = correct[p * g : (p + 1) * g]
    return float(correct[p * g + j]) if len(set(group)) > 1 else float(j % 2)


def _timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def bench_member(cfg, name: str, rounds: int, tmp: Path) -> dict:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    from corl.data import load_splits
    from corl.models.sampling import sample
    from corl.services.model.backends.transformers import TransformersBackend
    from corl.services.model.rendering import PromptRenderer
    from corl.tasks import get_task
    from corl.trainer.collate import pack
    from corl.trainer.losses import response_logps
    from corl.trainer.policy import PolicyTrainer
    from corl.trainer.publish import WeightsStore
    from corl.trainer.testing import batch_from_samples

    member = cfg.member(name)
    task = get_task(cfg.task.name)
    sp = cfg.sampling()
    rc = cfg.rounds
    rl = load_splits(cfg.task, rc.prompt_source.seed).rl
    backend = TransformersBackend(member.model_path(), name, num_threads=1)
    _, start_s = _timed(backend._start_sync)
    renderer = PromptRenderer(backend.tokenizer)
    policy = PolicyTrainer(cfg, name, torch.device("cpu"))
    store = WeightsStore(tmp / "weights", name)
    fmt = policy.format
    phases: dict[str, list[float]] = {k: [] for k in ("sampling", "grading", "logprobs", "step", "publish", "swap")}
    tokens: list[int] = []
    for r in range(rounds):
        examples = rl[r * rc.prompts_per_round : (r + 1) * rc.prompts_per_round]
        texts = renderer.render_all([e.prompt for e in examples], task.prompt_format)
        model = backend._active.model  # type: ignore[union-attr]
        results, s = _timed(
            sample,
            model,
            backend.tokenizer,
            texts,
            n=rc.samples_per_prompt,
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            stop=sp.stop,
            seed=r,
        )
        phases["sampling"].append(s)
        tokens.append(sum(len(c.token_ids) for p in results for c in p.completions))
        pairs = [(examples[p], c.text) for p, res in enumerate(results) for c in res.completions]
        correct, s = _timed(task.is_correct_many, pairs)
        phases["grading"].append(s)
        g = rc.samples_per_prompt
        batch = batch_from_samples(
            results, texts, sampling=sp, rewards=lambda p, j, c=correct, g=g: _reward(c, p, j, g), member=name, round_=r
        )
        packed = pack(batch.samples(), policy.pad_id)
        mb = cfg.training.micro_batch_size or packed.input_ids.shape[0]
        t0 = time.perf_counter()
        with torch.no_grad():  # in the trainer's micro-batches
            for i in range(0, packed.input_ids.shape[0], mb):
                rows = slice(i, i + mb)
                ids, mask = packed.input_ids[rows], packed.attention_mask[rows]
                response_logps(policy.model, ids, mask, packed.response_len, temperature=sp.temperature, top_p=sp.top_p)
        phases["logprobs"].append(time.perf_counter() - t0)
        stats, s = _timed(policy.step, batch)
        phases["step"].append(s)
        pub, s = _timed(store.save, policy.model, policy.tokenizer, r + 1, fmt)
        phases["publish"].append(s)
        _, s = _timed(backend._load_sync, r + 1, str(pub.path), fmt, pub.sha256)
        phases["swap"].append(s)
    t0 = time.perf_counter()
    raw = AutoModelForCausalLM.from_pretrained(member.model_path())
    for p in raw.parameters():
        p.detach().sum()  # read every weight into memory (from_pretrained maps the file lazily)
    raw_s = time.perf_counter() - t0
    first_swap = phases["swap"].pop(0)  # the first LoRA swap also reads the targeted initial weights once
    median = {k: round(statistics.median(v), 3) for k, v in phases.items()}
    return {
        "member": name,
        "family": backend.family,
        "parameters": backend.parameters,
        "weights": fmt,
        "server_start_s": round(start_s, 2),
        "raw_load_s": round(raw_s, 3),
        "first_swap_s": round(first_swap, 3),
        "completion_tokens": round(statistics.mean(tokens), 1),
        **{f"{k}_s": v for k, v in median.items()},
        # A round: everything but the log-probs pass, which is measured apart and is inside the step.
        "round_s": round(sum(v for k, v in median.items() if k != "logprobs"), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=Path("examples/trio-arith.yaml"))
    ap.add_argument("--rounds", type=int, default=3, help="Rounds per member (>= 2; medians are reported).")
    ap.add_argument("--members", default=None, help="Comma-separated subset of the config's members.")
    ap.add_argument("--before", action="store_true", help="The code paths before the round-cost work.")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the first swap is reported apart)")
    torch.set_num_threads(1)

    from corl.config import load_config

    cfg = load_config(args.config)
    names = args.members.split(",") if args.members else [m.name for m in cfg.members if m.role == "trained"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, _before() if args.before else contextlib.nullcontext():
        for name in names:
            row = {"code": "before" if args.before else "now", **bench_member(cfg, name, args.rounds, Path(tmp))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    total = round(sum(r["round_s"] for r in rows), 2)
    print(json.dumps({"code": rows[0]["code"], "cohort_round_cpu_s": total}))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "cohort_round_cpu_s": total}, indent=2) + "\n")


if __name__ == "__main__":
    main()
