"""The engine's keyword arguments are vLLM's own: every key ``engine_kwargs`` builds (tensor parallel
size included) is a field of the installed vLLM's ``AsyncEngineArgs``, so a renamed field fails here
rather than when a multi-GPU server starts."""

from __future__ import annotations

import dataclasses

import pytest

from corl.services.model.backends.vllm_engine import EngineOptions, engine_kwargs

pytestmark = pytest.mark.vllm


def test_engine_kwargs_are_async_engine_args_fields() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    options = EngineOptions(tensor_parallel_size=2, max_model_len=64, gpu_memory_utilization=0.8)
    kwargs = engine_kwargs("/m", options, on_gpu=False, lora=False)
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert set(kwargs) <= fields, sorted(set(kwargs) - fields)
    assert kwargs["tensor_parallel_size"] == 2
