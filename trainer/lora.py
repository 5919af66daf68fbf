"""LoRA mode (PEFT): train and publish only an adapter, for members too large to copy whole.

The published folder holds ``adapter_model.safetensors`` + ``adapter_config.json`` (format
``lora``); servers apply it to the base weights they already hold. The reference policy for the KL
term is the base model itself (adapter disabled), so no second copy of the weights is kept.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from corl.config import LoraConfig


def wrap(model: PreTrainedModel, cfg: LoraConfig, resume_from: Path | None = None):  # type: ignore[no-untyped-def]
    """A trainable PeftModel around ``model``: a fresh adapter, or the one saved in ``resume_from``."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    if resume_from is not None:
        return PeftModel.from_pretrained(model, str(resume_from), is_trainable=True)
    target = cfg.target_modules
    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, target_modules=target, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"
    )
    return get_peft_model(model, peft_cfg)


def is_peft(model: object) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")
