"""Cohort presets: which members a cohort has, their families and sizes, and how long they warm up.

Members are built from transformers config classes (no hub download), so every member is a real
Hugging Face model that transformers, TRL and vLLM load by path. Transformer members use attention
head size 32 or 64 because vLLM's CPU attention rejects 16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PretrainedConfig, PreTrainedTokenizerBase


@dataclass(frozen=True)
class WarmupSettings:
    """Supervised warm-up schedule. ``band`` is the greedy-accuracy window a member must stop in;
    ``None`` trains exactly ``max_steps`` steps (the micro preset, for tests)."""

    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.98)
    batch_size: int = 128
    check_every: int = 10
    max_steps: int = 2000
    band: tuple[float, float] | None = (0.40, 0.55)
    # After a check overshoots the band: roll back to the last below-band snapshot, then check
    # every ``fine_check_every`` steps with the learning rate scaled by ``fine_lr_scale``.
    fine_check_every: int = 1
    fine_lr_scale: float = 0.5
    max_rollbacks: int = 3


@dataclass(frozen=True)
class MemberSpec:
    name: str
    family: str  # transformers model_type: gpt2, mamba, llama, qwen2, ...
    arch: dict[str, Any] = field(default_factory=dict)  # config-class kwargs (sizes)

    def build_config(self, tokenizer: PreTrainedTokenizerBase, max_positions: int = 64) -> PretrainedConfig:
        """The member's config with vocabulary and special-token ids taken from ``tokenizer``."""
        from transformers import AutoConfig

        ids = dict(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        positions = {"gpt2": {"n_positions": max_positions}, "mamba": {}}.get(
            self.family, {"max_position_embeddings": max_positions}
        )
        return AutoConfig.for_model(self.family, **ids, **positions, **self.arch)


@dataclass(frozen=True)
class Preset:
    name: str
    members: tuple[MemberSpec, ...]
    warmup: WarmupSettings = WarmupSettings()


TINY = Preset(
    "tiny",
    (
        # ~0.1M: 2 layers, 2 heads of 32.
        MemberSpec("gpt2", "gpt2", dict(n_embd=64, n_layer=2, n_head=2)),
        # ~0.2M: attention-free state-space model, a different inductive bias from the rest. A small
        # state and no expansion because transformers' reference (non-CUDA) selective scan costs
        # batch x d_inner x seq x state per layer; it learns this task in few steps anyway.
        MemberSpec("mamba", "mamba", dict(hidden_size=128, num_hidden_layers=3, state_size=4, expand=1)),
        # ~0.3M: 2 layers, 3 heads of 32, SwiGLU MLP (4 narrower layers learned several times slower).
        MemberSpec(
            "llama",
            "llama",
            dict(
                hidden_size=96, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3, intermediate_size=384
            ),
        ),
        # ~1M: 2 layers, 6 query heads of 32 sharing 2 KV heads (GQA).
        MemberSpec(
            "qwen2",
            "qwen2",
            dict(
                hidden_size=192,
                num_hidden_layers=2,
                num_attention_heads=6,
                num_key_value_heads=2,
                intermediate_size=768,
            ),
        ),
    ),
)

# Two very small members and a few warm-up steps with no accuracy band: a real cohort on disk in
# seconds, for tests and smoke runs. Its members are not competent.
MICRO = Preset(
    "micro",
    (
        MemberSpec("gpt2", "gpt2", dict(n_embd=32, n_layer=1, n_head=1)),
        MemberSpec(
            "llama",
            "llama",
            dict(
                hidden_size=32, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, intermediate_size=64
            ),
        ),
    ),
    WarmupSettings(batch_size=32, check_every=2, max_steps=4, band=None),
)

PRESETS: dict[str, Preset] = {p.name: p for p in (TINY, MICRO)}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown cohort preset {name!r}; known: {sorted(PRESETS)}") from None
