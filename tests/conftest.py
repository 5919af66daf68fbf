"""Fixtures shared by every test tier: a tiny real model directory and a real Redis server."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _sandbox_jail_missing() -> str:
    """What keeps the sandbox's jail from being built here ("" when it can be). CI installs bubblewrap
    (.ci/run) and runs every program in the jail; on a machine without it the code tests run with the
    launcher alone (the operator's opt-out) and the attack suite is skipped, saying why."""
    from corl.sandbox import Limits
    from corl.sandbox.jail import ALLOW_INSECURE_ENV, probe

    jail, missing = probe(Limits().uid)
    if jail is None and not os.environ.get("CI"):
        os.environ[ALLOW_INSECURE_ENV] = "1"
        return missing
    return ""


JAIL_MISSING = _sandbox_jail_missing()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `jail` need the sandbox's jail: skipped, saying why, where it cannot be built."""
    if not JAIL_MISSING:
        return
    skip = pytest.mark.skip(reason=f"no sandbox jail here: {JAIL_MISSING} (CI installs it)")
    for item in items:
        if "jail" in item.keywords:
            item.add_marker(skip)


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
        vocab_size=len(tok),
        n_embd=64,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record_figure(**figures)``: print a chaos test's measured figures as one JSON line, and append
    it to the file named by ``CORL_CHAOS_RESULTS`` when set (docs/RELIABILITY.md quotes these)."""

    def record(**figures: object) -> None:
        line = json.dumps({"test": request.node.nodeid, **figures}, sort_keys=True)
        print(f"chaos figures: {line}")
        path = os.environ.get("CORL_CHAOS_RESULTS")
        if path:
            with open(path, "a") as out:
                out.write(line + "\n")

    return record


def _packaged_cohort(preset: str) -> Path:
    """A packaged cohort built once into ``$CORL_CACHE_DIR/cohorts/<preset>`` (default
    ``~/.cache/corl``): later runs reuse it in about a second."""
    from corl.cohort.packaged import build_packaged_cohort
    from corl.packages import cache_dir

    out = cache_dir().parent / "cohorts" / preset
    build_packaged_cohort(out, preset)
    return out


@pytest.fixture(scope="session")
def smol_cohort() -> Path:
    """The real ``smol`` cohort (SmolLM2-135M-Instruct, Gemma-3-270M)."""
    return _packaged_cohort("smol")


@pytest.fixture(scope="session")
def trio_cohort() -> Path:
    """The real ``trio`` cohort (``smol``'s two members and Qwen2.5-Coder-0.5B-Instruct)."""
    return _packaged_cohort("trio")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis on a free loopback port, started for this test session."""
    from corl.redis_server import LocalRedis

    with LocalRedis() as server:
        yield server.url


# --- model server: shared by tests/service and tests/vllm_backend (which overrides server_settings) ---

ADMIN_TOKEN = "test-admin-token"
WeightsFactory = Callable[..., tuple[Path, str]]


@pytest.fixture
def server_settings(tiny_model_dir: Path) -> Any:
    from corl.services.model.settings import BatchingSettings, ServerSettings

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
def member_stats() -> Callable[..., Any]:
    """``member_stats(**fields) -> MemberRoundStats``: one member's figures of a round, plain values
    (a batch written, no diagnostics) but for the fields a test names."""
    from corl.proto import MemberRoundStats

    def build(**fields: Any) -> MemberRoundStats:
        figures = dict(
            mean_reward=0.5, label_rate=1.0, distinct_answers=4.0, answer_entropy=1.0, mean_response_tokens=3.0
        )
        return MemberRoundStats.model_validate({**figures, "batch_written": True, **fields})

    return build


@pytest.fixture
def loopback_listener() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1 (its port: ``getsockname()[1]``) that a sandboxed program
    must never reach; ``accept`` times out after 0.2 s. Closed after the test."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def model_app(server_settings: Any) -> AsyncIterator[Any]:
    """The real app with the tiny model, lifespan run, model loaded."""
    from corl.services.model.app import create_app

    app = create_app(server_settings)
    async with app.router.lifespan_context(app):
        await app.state.serving.wait_ready(60)
        yield app


@pytest.fixture
async def client(model_app: Any) -> AsyncIterator[Any]:
    import httpx

    transport = httpx.ASGITransport(app=model_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model", timeout=60.0) as c:
        yield c


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
