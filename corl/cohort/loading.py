"""Loading a member: a local save_pretrained directory or a hub id, with its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

MEMBER_META = "corl_member.json"


def load_member(
    name_or_path: str | Path, *, device: str = "cpu", dtype: Any = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer by path or hub id, in eval mode and ready for batched sampling.

    Tokenizers without a pad token (most hub models) get their EOS as pad; padding goes on the left
    so that batched generation continues every prompt from its last token.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = str(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(src)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype or torch.float32)
    model.to(device)  # type: ignore[arg-type]  # transformers types .to() through a decorator
    model.eval()
    return model, tokenizer


def parameter_count(model: PreTrainedModel) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
