"""A vLLM member's ``vllm`` options in the cohort config reach its servers: ``corl run`` starts them
with the member's backend and the options as the server's engine settings, and the engine hands
them to vLLM's ``AsyncEngineArgs`` (checked on the keyword arguments, without importing vLLM)."""

from __future__ import annotations

from typing import Any

import pytest

from corl.config import MemberVllm, parse_config
from corl.embedded.start import start_model_servers
from corl.services.model.backends.vllm_engine import EngineOptions, engine_kwargs
from corl.services.model.settings import ServerSettings, engine_env

BIG = {
    "name": "big",
    "model": "/models/qwen2.5-7b",
    "servers": ["http://127.0.0.1:8101", "http://127.0.0.1:8102"],
    "backend": "vllm",
    "vllm": {"tensor_parallel_size": 4, "gpu_memory_utilization": 0.85, "max_model_len": 4096},
}
SMALL = {"name": "small", "model": "/models/gpt2", "servers": ["http://127.0.0.1:8103"]}


class _Group:
    """Records what ``start_model_servers`` starts (a ``ProcessGroup`` without processes)."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[list[str], dict[str, str]]] = {}

    def start(self, name: str, args: list[str], health_url: str | None = None, env: Any = None) -> None:
        self.started[name] = (list(args), dict(env or {}))

    def wait_healthy(self) -> None:
        pass


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> ServerSettings:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return ServerSettings(model_dir="/m")


def test_every_member_vllm_option_is_an_engine_option() -> None:
    """The member's section is a subset of the server's: each option has one name on both sides."""
    assert set(MemberVllm.model_fields) <= set(EngineOptions.model_fields)


def test_corl_run_starts_a_vllm_members_servers_with_its_backend_and_engine_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = parse_config({"members": [BIG, SMALL]})
    group = _Group()
    start_model_servers(cfg, group)  # type: ignore[arg-type]
    assert sorted(group.started) == ["server-big-0", "server-big-1", "server-small-0"]
    for name in ("server-big-0", "server-big-1"):
        args, env = group.started[name]
        assert args[args.index("--backend") + 1] == "vllm"
        engine = _settings_from(env, monkeypatch).vllm
        assert (engine.tensor_parallel_size, engine.gpu_memory_utilization, engine.max_model_len) == (4, 0.85, 4096)
        assert "CORL_REQUEST_TIMEOUT_S" in env  # the run's own settings are still there
    args, env = group.started["server-small-0"]
    assert args[args.index("--backend") + 1] == "transformers"
    assert not [k for k in env if k.startswith("CORL_VLLM__")]


def test_unset_options_keep_the_servers_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = parse_config({"members": [{**BIG, "vllm": {"tensor_parallel_size": 2}}, SMALL]})
    group = _Group()
    start_model_servers(cfg, group)  # type: ignore[arg-type]
    env = group.started["server-big-0"][1]
    assert {k: v for k, v in env.items() if k.startswith("CORL_VLLM__")} == {"CORL_VLLM__TENSOR_PARALLEL_SIZE": "2"}
    engine = _settings_from(env, monkeypatch).vllm
    assert engine.tensor_parallel_size == 2
    assert engine.gpu_memory_utilization == EngineOptions().gpu_memory_utilization and engine.max_model_len is None


def test_engine_env_refuses_what_the_server_would_not_read() -> None:
    with pytest.raises(ValueError, match="tensor_paralel_size"):
        engine_env({"tensor_paralel_size": 2})


@pytest.mark.parametrize("on_gpu", [True, False])
def test_the_engine_args_carry_tensor_parallel_size(on_gpu: bool) -> None:
    options = EngineOptions(tensor_parallel_size=4, max_model_len=4096, gpu_memory_utilization=0.85)
    kwargs = engine_kwargs("/m", options, on_gpu=on_gpu, lora=False)
    assert (kwargs["tensor_parallel_size"], kwargs["max_model_len"], kwargs["gpu_memory_utilization"]) == (
        4,
        4096,
        0.85,
    )
    assert kwargs["dtype"] == ("auto" if on_gpu else "float32")
    assert engine_kwargs("/m", EngineOptions(), on_gpu=True, lora=False)["tensor_parallel_size"] == 1


def test_extra_engine_args_pass_through_but_never_shadow_an_option() -> None:
    kwargs = engine_kwargs("/m", EngineOptions(extra={"enforce_eager": True}), on_gpu=True, lora=False)
    assert kwargs["enforce_eager"] is True
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        engine_kwargs("/m", EngineOptions(extra={"tensor_parallel_size": 2}), on_gpu=True, lora=False)
