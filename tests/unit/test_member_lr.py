"""A member's own learning rate: the trainer's optimizer uses it; members without one use
``training.lr``; a frozen member cannot have one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from corl.cohort.presets import MICRO
from corl.config import ConfigError, parse_config
from corl.models.tokenizer import build_char_tokenizer
from corl.trainer.policy import PolicyTrainer


def _config(model: str, **gemma: object):  # type: ignore[no-untyped-def]
    return parse_config(
        {
            "members": [
                {"name": "a", "model": model, "servers": ["http://a"], **gemma},
                {"name": "b", "model": model, "servers": ["http://b"]},
            ],
            "training": {"lr": 1e-4},
        }
    )


def test_each_trainer_takes_its_members_lr(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    AutoModelForCausalLM.from_config(MICRO.members[0].build_config(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = _config(str(tmp_path), lr=2e-5)
    for member, lr in (("a", 2e-5), ("b", 1e-4)):
        assert cfg.lr(member) == lr
        policy = PolicyTrainer(cfg, member, torch.device("cpu"))
        assert [g["lr"] for g in policy.optimizer.param_groups] == [lr]


def test_a_frozen_member_takes_no_lr() -> None:
    with pytest.raises(ConfigError, match="frozen members do not train"):
        _config("m", lr=1e-5, role="frozen")
