"""A tiny model with room for long prompts, so that fuzzed prompts rarely hit the context limit."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import FUZZ_CONTEXT


@pytest.fixture(scope="session")
def fuzz_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GPT-2 of tests/conftest.py (same char tokenizer), with a context of ``FUZZ_CONTEXT``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("fuzz-gpt2")
    cfg = AutoConfig.from_pretrained(tiny_model_dir, n_positions=FUZZ_CONTEXT)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out
