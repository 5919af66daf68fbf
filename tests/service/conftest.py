"""Model server fixtures: settings for the tiny model, an in-process app, and weight directories."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from corl.services.model.app import create_app
from corl.services.model.settings import BatchingSettings, ServerSettings

ADMIN_TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def server_settings(tiny_model_dir: Path) -> ServerSettings:
    return ServerSettings(
        _env_file=None,  # type: ignore[call-arg]
        model_dir=str(tiny_model_dir),
        name="tiny",
        admin_token=ADMIN_TOKEN,
        num_threads=1,
        max_prompts=8,
        max_n=16,
        max_tokens=32,
        max_body_bytes=16_384,
        request_timeout_s=30.0,
        batch=BatchingSettings(window_ms=10.0),
    )


@pytest.fixture
async def model_app(server_settings: ServerSettings) -> AsyncIterator[FastAPI]:
    """The real app with the tiny model, lifespan run, model loaded."""
    app = create_app(server_settings)
    async with app.router.lifespan_context(app):
        await app.state.serving.wait_ready(60)
        yield app


@pytest.fixture
async def client(model_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=model_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model", timeout=30.0) as c:
        yield c


WeightsFactory = Callable[..., tuple[Path, str]]


@pytest.fixture(scope="session")
def make_weights(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> WeightsFactory:
    """``make_weights(seed, **config_overrides) -> (dir, sha256)``: freshly initialised weights of the
    tiny model's architecture (or a changed one), in save_pretrained layout, with their checksum.
    A large init range makes greedy outputs clearly weight-dependent."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from corl.weights_store import digest

    def factory(seed: int, initializer_range: float = 0.5, **overrides: object) -> tuple[Path, str]:
        cfg = AutoConfig.from_pretrained(tiny_model_dir, initializer_range=initializer_range, **overrides)
        torch.manual_seed(seed)
        out = tmp_path_factory.mktemp(f"weights-{seed}")
        AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
        return out, digest(out)

    return factory
