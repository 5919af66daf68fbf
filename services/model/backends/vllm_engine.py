"""One vLLM ``AsyncLLM`` on its own event-loop thread, shareable by successive backends.

The engine client runs on a dedicated loop (thread ``corl-vllm``) rather than the server's:
vLLM's output processing then never competes with HTTP handling on the server loop, and one
engine (tens of seconds to start) can outlive an app, so tests and benchmarks start it once.
Callers hand it coroutines with ``run``; cancelling the awaiting side cancels the coroutine on
the engine loop, which makes vLLM abort the request.

vLLM is imported here only, and only when an engine is built, so the model server imports
without vLLM installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

T = TypeVar("T")


class EngineOptions(BaseModel):
    """vLLM engine settings of the model server (nestable in its settings); anything else vLLM's
    ``AsyncEngineArgs`` takes goes in ``extra``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: float32 on CPU (parity with the transformers backend), vLLM's choice on GPU."
    )
    max_model_len: int | None = Field(default=None, ge=1, description="None: the model config's context length.")
    enable_lora: bool | None = Field(default=None, description="None: on where vLLM implements LoRA for the model.")
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16
    max_loras: int = Field(default=2, ge=1, description="Adapters per batch: the serving one and the one draining.")
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="GPUs the model is sharded over (a vLLM worker each, one node); a swap reloads every shard.",
    )
    cpu_kv_cache_gib: int = Field(default=1, ge=1, description="VLLM_CPU_KVCACHE_SPACE (CPU only).")
    seed: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)


def lora_supported(model_dir: str) -> bool:
    """Whether vLLM implements LoRA for this model's architecture (GPT-2 and Mamba: no)."""
    from transformers import AutoConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora

    archs = getattr(AutoConfig.from_pretrained(model_dir), "architectures", None) or []
    for arch in archs:
        try:
            cls = ModelRegistry._try_load_model_cls(arch)  # no public lookup without a full ModelConfig
        except Exception:  # noqa: BLE001 - an unknown architecture simply has no LoRA support
            cls = None
        if cls is not None:
            return bool(supports_lora(cls))
    return False


def engine_kwargs(model_dir: str, options: EngineOptions, *, on_gpu: bool, lora: bool) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``AsyncEngineArgs`` for these options (pure: no vLLM import).

    ``tensor_parallel_size`` > 1 asks for that many devices on this node: vLLM then runs one worker per
    GPU under its multiprocessing executor (its default when the node has the GPUs), and the swap's
    ``collective_rpc("reload_weights")`` reaches every worker, each loading its own shard."""
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "dtype": options.dtype if options.dtype != "auto" or on_gpu else "float32",
        "seed": options.seed,
        # The log-prob of each sampled token after temperature / top-p: what sampling drew from.
        "logprobs_mode": "processed_logprobs",
        "enable_prefix_caching": True,
        "enable_lora": lora,
        "max_lora_rank": options.max_lora_rank,
        "max_loras": options.max_loras,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "tensor_parallel_size": options.tensor_parallel_size,
        "disable_log_stats": True,
    }
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    if on_gpu:  # the in-memory weight path: each worker can join the member's NCCL weight group
        kwargs["worker_extension_cls"] = "corl.services.model.backends.vllm_transfer.TransferWorker"
    twice = sorted(kwargs.keys() & options.extra.keys())
    if twice:
        raise ValueError(f"vLLM options {twice} are set by EngineOptions fields; remove them from extra")
    return {**kwargs, **options.extra}


class VLLMEngine:
    """Owns the ``AsyncLLM``, its loop thread and which weights directory it holds."""

    def __init__(self, model_dir: str, options: EngineOptions | None = None) -> None:
        self.model_dir = str(model_dir)
        self.options = options or EngineOptions()
        self.weights_path = self.model_dir  # directory of the full weights now in the engine
        self.lora_enabled = False
        self.transfer = False  # its workers can join a weight group (the extension: engines on GPUs)
        self.max_model_len: int | None = None
        self._lora_ids = itertools.count(1)  # adapter ids are never reused within one engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._llm: Any = None

    @property
    def llm(self) -> Any:
        if self._llm is None:
            raise RuntimeError("vLLM engine is not started")
        return self._llm

    @property
    def started(self) -> bool:
        return self._llm is not None

    def next_lora_id(self) -> int:
        return next(self._lora_ids)

    def start(self) -> None:
        """Build the engine (blocking: tens of seconds on CPU). Idempotent."""
        if self._llm is not None:
            return
        import torch

        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.options.cpu_kv_cache_gib))
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="corl-vllm", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._llm = asyncio.run_coroutine_threadsafe(self._build(on_gpu), loop).result()
        except BaseException:
            self._stop_loop()
            raise
        self.max_model_len = int(self._llm.model_config.max_model_len)

    async def _build(self, on_gpu: bool) -> Any:
        # AsyncLLM binds its client sockets and output handler to the loop that builds it.
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        o = self.options
        lora = lora_supported(self.model_dir) if o.enable_lora is None else o.enable_lora
        kwargs = engine_kwargs(self.model_dir, o, on_gpu=on_gpu, lora=lora)
        self.lora_enabled = lora
        self.transfer = "worker_extension_cls" in kwargs
        log.info(
            "starting vLLM engine for %s (dtype %s, tensor parallel %d, lora %s)",
            self.model_dir,
            kwargs["dtype"],
            o.tensor_parallel_size,
            lora,
        )
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the engine loop from any other loop."""
        if self._loop is None:
            coro.close()
            raise RuntimeError("vLLM engine is not started")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def shutdown(self) -> None:
        """Stop the engine processes and the loop thread (blocking, a few seconds). Idempotent."""
        llm, self._llm = self._llm, None
        if llm is not None:
            try:
                llm.shutdown()
            except Exception:  # noqa: BLE001 - shutting down; nothing left to protect
                log.exception("vLLM engine shutdown failed")
        self._stop_loop()

    def _stop_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            # vLLM's output-handler tasks are still pending on the loop: cancel them, then stop it.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)
            loop.close()
        self._thread = None


async def _cancel_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
