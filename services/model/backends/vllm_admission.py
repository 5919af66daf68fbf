"""The vLLM backend's admission gate: which weights (a version, and an adapter or none) a new request
is served with, how many requests hold them, and the drain a full swap needs. vLLM batches requests
itself, so the gate only counts them: ``held`` holds the serving weights for one request, ``drained``
closes the gate and waits until no request holds any (new ones wait, none fails), ``serve`` switches
what new requests get. An adapter that is neither serving nor held by a request is unloaded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Serving:
    """What a new request is served with; replaced as a whole, so readers see one consistent pair."""

    version: int
    lora: Any = None  # vllm LoRARequest, or None for the plain weights


class Admission:
    def __init__(self, serving: Serving, remove_lora: Callable[[int], Awaitable[None]]) -> None:
        self.serving = serving
        self._remove_lora = remove_lora  # unloads an adapter from the engine (errors are logged)
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight = 0
        self._by_lora: dict[int, int] = {}  # adapter id -> requests in flight with it
        self._tasks: set[asyncio.Future[None]] = set()
        self.peak_inflight = 0  # most requests in the engine at once (continuous batching at work)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Serving]:
        """Hold the serving weights for one request; a full swap waits until no one holds them."""
        while not self._open.is_set():
            await self._open.wait()
        serving = self.serving
        lora_id = serving.lora.lora_int_id if serving.lora is not None else None
        self._inflight += 1
        self.peak_inflight = max(self.peak_inflight, self._inflight)
        self._idle.clear()
        if lora_id is not None:
            self._by_lora[lora_id] = self._by_lora.get(lora_id, 0) + 1
        try:
            yield serving
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
            if lora_id is not None:
                self._by_lora[lora_id] -= 1
                current = self.serving.lora
                if self._by_lora[lora_id] == 0 and (current is None or current.lora_int_id != lora_id):
                    self._unload(lora_id)

    def serve(self, new: Serving) -> None:
        """Switch what new requests get; an adapter nobody uses any more is unloaded."""
        old, self.serving = self.serving, new
        if old.lora is not None and self._by_lora.get(old.lora.lora_int_id, 0) == 0:
            self._unload(old.lora.lora_int_id)

    @contextlib.asynccontextmanager
    async def drained(self) -> AsyncIterator[None]:
        """Close admission and wait for the requests in flight; new requests wait, not fail."""
        self._open.clear()
        try:
            await self._idle.wait()
            yield
        finally:
            self._open.set()

    def _unload(self, lora_id: int) -> None:
        self._by_lora.pop(lora_id, None)
        task = asyncio.ensure_future(self._remove_lora(lora_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
