"""The policy side of a trainer: the member's weights, the optimizer, and one GRPO-family update on
a graded batch (advantages, packing, clipped loss, micro-batched backward, clipping, step). No
Redis, no HTTP: the loop feeds it batches; benchmarks and tests drive it directly."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from corl.config import CohortConfig
from corl.proto import GradedBatch, SamplingSettings

from .advantages import group_advantages
from .checkpoint import Checkpointer, TrainerState, is_sharded_checkpoint, load_sharded
from .collate import pack
from .losses import policy_loss, response_logps
from .publish import Published, WeightsStore
from .sharding import LocalChunk, Sharding, default_micro_batch, split_chunks
from .snapshot import cpu_snapshot


@dataclass(frozen=True)
class StepStats:
    loss: float
    mean_reward: float
    advantage_std: float
    clip_fraction: float
    approx_kl: float
    ref_kl: float | None
    entropy: float
    grad_norm: float
    seconds: float
    tokens: int
    sequences: int
    groups_skipped: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def reported(self) -> dict[str, float]:
        """What experiment trackers get: the batch's reward always, the update's figures when there was one."""
        out = {"mean_reward": self.mean_reward, "groups_skipped": float(self.groups_skipped)}
        if self.sequences:
            out |= {
                "loss": self.loss,
                "approx_kl": self.approx_kl,
                "clip_fraction": self.clip_fraction,
                "entropy": self.entropy,
                "grad_norm": self.grad_norm,
                "advantage_std": self.advantage_std,
                "tokens_per_second": self.tokens_per_second,
                "step_seconds": self.seconds,
            }
            if self.ref_kl is not None:
                out["ref_kl"] = self.ref_kl
        return out


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def enable_gradient_checkpointing(model: Any) -> None:
    """Checkpoint every layer (non-reentrant, so LoRA's frozen inputs still get gradients); the KV cache is off."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 name; the old one warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


class PolicyTrainer:
    """The model, optimizer and one GRPO-family update on a graded batch; no Redis, no HTTP."""

    def __init__(
        self,
        cfg: CohortConfig,
        member: str,
        device: torch.device,
        resume_from: Path | None = None,
        sharding: Sharding | None = None,
    ):
        """``resume_from``: a checkpoint folder; ``sharding``: this process is one rank of the member's
        trainer group (``trainer/sharding.py``), and its checkpoints are torch.distributed ones."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl.trainer.utils import disable_dropout_in_model

        from . import lora

        self.cfg, self.train_cfg, self.device, self.sharding = cfg, cfg.training, device, sharding
        if resume_from is not None and is_sharded_checkpoint(resume_from) != (sharding is not None):
            writer, reader = ("a trainer group", "one process") if sharding is None else ("one process", "a group")
            raise ValueError(
                f"checkpoint {resume_from} was written by {writer}, and this trainer is {reader}: "
                "resume with the member's trainer_processes as it was"
            )
        src = cfg.member(member).model_path()
        torch.manual_seed(cfg.training.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(src)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.format = "lora" if cfg.training.lora else "full"
        hf_resume = None if sharding else resume_from  # a group loads its sharded checkpoint below
        if cfg.training.lora:
            # The frozen base in the dtype it is stored in (a bfloat16 member trains in half the memory);
            # PEFT keeps the adapters, the only trained weights, in float32.
            base = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
            model = lora.wrap(base, cfg.training.lora, hf_resume)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(hf_resume or src), dtype=torch.float32)
        disable_dropout_in_model(model)  # dropout would make the ratio to the sampling policy != 1 on-policy
        if cfg.training.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.model = model.to(device)
        self.model.train()
        # What the forward passes of the update go through: the model, or its DDP / FSDP2 form.
        self.forward_model = sharding.wrap(self.model, device) if sharding else self.model
        self.ref_model: Any = None
        if cfg.training.beta > 0 and not lora.is_peft(self.model):
            ref: Any = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
            ref = ref.to(device).eval().requires_grad_(False)
            self.ref_model = sharding.shard_frozen(ref) if sharding else ref
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params
        self.optimizer = torch.optim.AdamW(
            params, lr=cfg.lr(member), betas=cfg.training.betas, weight_decay=cfg.training.weight_decay
        )
        if sharding and resume_from is not None:
            load_sharded(resume_from, self.model, self.optimizer)
        # Called before the next optimizer step changes the weights, then cleared: a reader of the
        # weights still at work beside the step (the loop's snapshot of a version) is waited for there.
        self.before_update: Callable[[], None] | None = None

    # -- weights out: the same calls on every rank of a group (some are collectives) -------------------

    def save_weights(self, store: WeightsStore | None, version: int) -> Published | None:
        """Publish the weights (or adapter) as ``version``; in a group the leader writes them, whole."""
        if self.sharding is None:
            assert store is not None
            return store.save(self.model, self.tokenizer, version, self.format)  # type: ignore[arg-type]
        full = self.sharding.full_state_dict(self.model)
        if store is None or full is None:
            return None
        return store.save(self.model, self.tokenizer, version, self.format, state_dict=full)  # type: ignore[arg-type]

    @torch.no_grad()
    def weights_snapshot(
        self, dtype: torch.dtype, into: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor] | None:
        """The full weights as a CPU snapshot in the servers' ``dtype`` (``cpu_snapshot``), reusing
        ``into``. In a group a collective (every rank calls it); None off the leader."""
        if self.sharding is None:
            return cpu_snapshot(self.model.state_dict(), dtype, into)
        full = self.sharding.full_state_dict(self.model)  # already CPU copies: ``into`` would not save one
        return None if full is None else cpu_snapshot(full, dtype)

    def save_snapshot(self, store: WeightsStore, version: int, snapshot: dict[str, torch.Tensor]) -> Published:
        """Write ``snapshot`` (``weights_snapshot``'s) as ``version``: no collective, any thread."""
        # save_pretrained pops the tensors it writes from the dict it is given: a copy of the mapping.
        return store.save(self.model, self.tokenizer, version, self.format, state_dict=dict(snapshot))  # type: ignore[arg-type]

    def save_checkpoint(self, checkpointer: Checkpointer, state: TrainerState) -> Path:
        if self.sharding is None:
            return checkpointer.save(self.model, self.optimizer, state)
        return checkpointer.save_sharded(self.model, self.optimizer, state, self.sharding)

    def keepalive(self) -> None:
        """Nothing to keep alive in one process (a group's leader tells its followers it is there)."""

    def close(self) -> None:
        """Leave the trainer group (nothing to release in one process). The DDP wrapper goes first:
        freed at interpreter exit it joins gloo's threads while holding the GIL they wait for."""
        if self.sharding is None:
            return
        self.forward_model = self.model
        gc.collect()
        self.sharding.close()

    def _ref_logps(self, input_ids: torch.Tensor, attn: torch.Tensor, t: int, sp: SamplingSettings) -> torch.Tensor:
        kw = {
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "with_entropy": False,
            "same_passes": bool(self.sharding),
        }
        with torch.no_grad():
            if self.ref_model is not None:
                return response_logps(self.ref_model, input_ids, attn, t, **kw)[0]  # type: ignore[arg-type]
            with self.model.disable_adapter():  # LoRA: the base weights are the reference
                return response_logps(self.model, input_ids, attn, t, **kw)[0]  # type: ignore[arg-type]

    def _micro_batch_size(self, rows: int) -> int:
        size = self.train_cfg.micro_batch_size
        return size or (default_micro_batch(rows, self.sharding.world) if self.sharding else rows)

    def _local_chunks(self, chunks: list[tuple[slice, int]]) -> list[LocalChunk]:
        """This process's micro-batches: all of them, or in a group its rank's share (``split_chunks``)."""
        if self.sharding is None:
            return [LocalChunk(sl, length, 1.0) for sl, length in chunks]
        return split_chunks(chunks, self.sharding.rank, self.sharding.world)

    def _gradient_sync(self, last: bool):  # type: ignore[no-untyped-def]
        """In a group, gradients are reduced over the ranks on the step's last backward only."""
        return self.sharding.gradient_sync(self.forward_model, last) if self.sharding else contextlib.nullcontext()

    def _clip_grad_norm(self, max_norm: float) -> float:
        if self.sharding:
            return self.sharding.clip_grad_norm(self.params, max_norm)
        return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))

    def tokens_outside_vocab(self, batch: GradedBatch) -> str | None:
        """Why ``batch`` cannot be trained on (a token id the model has no embedding for), or None."""
        vocab = self.model.get_input_embeddings().weight.shape[0]
        ids = (
            t
            for g in batch.groups
            for t in (*g.prompt_token_ids, *(t for s in g.samples for t in s.response_token_ids))
        )
        top = max(ids)
        return f"token id {top} outside the vocabulary ({vocab})" if top >= vocab else None

    def step(self, batch: GradedBatch) -> StepStats:
        """One update (``steps_per_batch`` optimizer steps) on ``batch``."""
        tc, sp, t0 = self.train_cfg, batch.sampling, time.perf_counter()
        rows = batch.samples()
        rewards = torch.tensor([s.reward for _, s in rows], dtype=torch.float32)
        weights = torch.tensor([g.weight for g, _ in rows], dtype=torch.float32)
        adv = group_advantages(rewards, [g.group_id for g, _ in rows], scale_rewards=tc.scale_rewards, weights=weights)
        kept = [i for i, k in enumerate(adv.keep.tolist()) if k]
        # Within a group, shortest answers first: micro-batches then hold answers of like length and
        # each is cut to its own longest (``_micro_batches``). A group's rows are interchangeable.
        kept.sort(key=lambda i: (rows[i][0].group_id, len(rows[i][1].response_token_ids)))
        mean_reward = float(rewards.mean())
        if not kept:
            return StepStats(
                0.0, mean_reward, 0.0, 0.0, 0.0, None, 0.0, 0.0, time.perf_counter() - t0, 0, 0, adv.skipped_groups
            )
        packed = pack([rows[i] for i in kept], self.pad_id)
        advantages = adv.advantages[kept].to(self.device)
        ids, attn = packed.input_ids.to(self.device), packed.attention_mask.to(self.device)
        mask, old = packed.response_mask.to(self.device), packed.old_logps.to(self.device)
        n, t = ids.size(0), packed.response_len
        every_chunk = _micro_batches(mask, self._micro_batch_size(n))
        chunks = self._local_chunks(every_chunk)
        # Reference log-probs chunk by chunk, each cut to its own longest answer like the update's.
        refs = [self._ref_logps(*_cut(ids, attn, t, c), c.length, sp) for c in chunks] if tc.beta > 0 else None
        total_tokens = float(mask.sum())
        world = self.sharding.world if self.sharding else 1
        stats: dict[str, float] = {}
        grad_norm = 0.0
        for _ in range(tc.steps_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            acc = {"loss": 0.0, "clip": 0.0, "kl": 0.0, "ref_kl": 0.0, "ent": 0.0}
            for i, c in enumerate(chunks):
                sl, length = c.rows, c.length
                with self._gradient_sync(last=i == len(chunks) - 1):
                    logps, ent = response_logps(
                        self.forward_model,
                        *_cut(ids, attn, t, c),
                        length,
                        temperature=sp.temperature,
                        top_p=sp.top_p,
                        same_passes=self.sharding is not None,
                    )
                    out = policy_loss(
                        logps,
                        old[sl, :length],
                        advantages[sl],
                        mask[sl, :length],
                        loss_type=tc.loss_type,
                        epsilon_low=tc.epsilon,
                        epsilon_high=tc.epsilon_high,
                        beta=tc.beta,
                        ref_logps=None if refs is None else refs[i],
                        max_completion_length=sp.max_tokens,
                        num_items_in_batch=total_tokens,
                    )
                    # Scale each micro-batch so their sum is the whole-batch loss of this loss type; a
                    # group's ranks average their gradients, so each multiplies its sum by the group size.
                    scale = c.weight * _chunk_scale(tc.loss_type, (sl.stop - sl.start) / n, len(every_chunk))
                    (out.loss * scale * world).backward()
                tok_share = float(mask[sl].sum()) / max(total_tokens, 1.0) * c.weight
                acc["loss"] += float(out.loss.detach()) * scale
                acc["clip"] += out.clip_fraction * tok_share
                acc["kl"] += out.approx_kl * tok_share
                acc["ref_kl"] += (out.ref_kl or 0.0) * tok_share
                assert ent is not None
                acc["ent"] += float((ent * mask[sl, :length]).sum()) / max(total_tokens, 1.0) * c.weight
            grad_norm = self._clip_grad_norm(tc.grad_clip)
            if self.before_update is not None:
                wait, self.before_update = self.before_update, None
                wait()
            self.optimizer.step()
            stats = self.sharding.sum(acc) if self.sharding else acc
        seconds = time.perf_counter() - t0
        return StepStats(
            loss=stats["loss"],
            mean_reward=mean_reward,
            advantage_std=float(advantages.std()) if n > 1 else 0.0,
            clip_fraction=stats["clip"],
            approx_kl=stats["kl"],
            ref_kl=stats["ref_kl"] if tc.beta > 0 else None,
            entropy=stats["ent"],
            grad_norm=grad_norm,
            seconds=seconds,
            tokens=packed.tokens * tc.steps_per_batch,
            sequences=n,
            groups_skipped=adv.skipped_groups,
        )


def _chunk_scale(loss_type: str, share: float, chunks: int) -> float:
    """What a micro-batch's loss is multiplied by so the micro-batches sum to the whole batch's loss:
    its share of the rows (grpo, dr_grpo: per-row means); 1 (dapo: already over the whole batch's
    tokens); 1/chunks (bnpo: per micro-batch, as TRL normalises per device batch)."""
    return 1.0 if loss_type == "dapo" else (1 / chunks if loss_type == "bnpo" else share)


def _cut(ids: torch.Tensor, attn: torch.Tensor, t: int, c: LocalChunk) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's rows, without the trailing columns that are padding in every one of them."""
    cut = ids.size(1) - t + c.length
    return ids[c.rows, :cut], attn[c.rows, :cut]


def _micro_batches(response_mask: torch.Tensor, size: int) -> list[tuple[slice, int]]:
    """Consecutive row slices of at most ``size`` rows, each with its longest response: a chunk's
    forward runs over that many response positions, not the whole batch's longest (short answers
    padded to one long one would cost as much as long answers). Exact: the columns cut are padding
    in every row of the chunk, and causal attention never lets a later position change an earlier."""
    n = response_mask.size(0)
    lengths = response_mask.sum(-1).long()
    chunks = []
    for i in range(0, n, size):
        sl = slice(i, min(i + size, n))
        chunks.append((sl, max(int(lengths[sl].max()), 1)))
    return chunks
