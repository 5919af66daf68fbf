"""Fixtures shared by every test tier: a tiny real model directory and a real Redis server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny GPT-2 with the project's char tokenizer, in save_pretrained layout."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from corl.models.tokenizer import build_char_tokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-gpt2")
    tok = build_char_tokenizer()
    cfg = GPT2Config(
        vocab_size=len(tok), n_embd=64, n_layer=2, n_head=2, n_positions=64,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis on a free loopback port, started for this test session."""
    from corl.redis_server import LocalRedis

    with LocalRedis() as server:
        yield server.url
