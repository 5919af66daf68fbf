"""Dynamic batching: concurrent generate calls with compatible sampling parameters become one
backend call.

One worker task takes the oldest waiting request, waits up to ``window_s`` for more (only while
fewer wait than were recently in flight: a lone request on a quiet server goes straight through), merges
every waiting request with the same parameters up to ``max_sequences`` (prompts x n), makes one
backend call,
and hands each caller its slice, all tagged with the batch's single weight version. Requests
that arrive while a batch runs queue up and form the next batch, so a busy server batches more.
Seeded requests are never merged: their output must not depend on who else was waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from .backends.base import GenerateOutput, SamplingParams

log = logging.getLogger(__name__)

GenerateFn = Callable[[Sequence[str], SamplingParams], Awaitable[GenerateOutput]]
BatchObserver = Callable[[int, int], None]  # (requests merged, prompts)


@dataclass
class _Pending:
    prompts: list[str]
    params: SamplingParams
    future: asyncio.Future[GenerateOutput] = field(repr=False)

    @property
    def key(self) -> object:
        p = self.params
        if p.seed is not None:
            return id(self)
        # Greedy decoding ignores top_p: all greedy requests of one length and stop set merge.
        if p.temperature == 0:
            return (p.n, p.max_tokens, 0.0, 1.0, p.stop)
        return (p.n, p.max_tokens, p.temperature, p.top_p, p.stop)

    @property
    def sequences(self) -> int:
        return len(self.prompts) * self.params.n


class GenerateBatcher:
    def __init__(
        self, generate: GenerateFn, *, window_s: float, max_sequences: int, observer: BatchObserver | None = None
    ) -> None:
        self._generate = generate
        self._window = window_s
        self._max = max_sequences
        self._observer = observer
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # Per parameter key: submitted and not yet answered (queued or running), and the most in flight
        # at once since the last batch of that key formed, which is the load to expect next.
        self._inflight: dict[object, int] = {}
        self._peak: dict[object, int] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="corl-batcher")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def submit(self, prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        fut: asyncio.Future[GenerateOutput] = asyncio.get_running_loop().create_future()
        pending = _Pending(list(prompts), params, fut)
        self._queue.put_nowait(pending)
        key = pending.key if params.seed is None else None  # seeded requests never wait for company
        self._inflight[key] = now = self._inflight.get(key, 0) + 1
        self._peak[key] = max(self._peak.get(key, 0), now)
        try:
            return await fut
        finally:
            self._inflight[key] -= 1
            if len(self._inflight) > 64:  # clients choose keys: forget quiet ones to stay bounded
                for k in [k for k, v in self._inflight.items() if not v]:
                    del self._inflight[k]
                    self._peak.pop(k, None)

    async def _run(self) -> None:
        waiting: list[_Pending] = []
        while True:
            if not waiting:
                waiting.append(await self._queue.get())
            await self._collect(waiting)
            batch, waiting = self._take(waiting)
            if batch:
                await self._serve(batch)

    async def _collect(self, waiting: list[_Pending]) -> None:
        """Gather compatible requests until as many wait as were in flight at the peak since the last
        batch formed (callers of a running batch come back when it ends), the batch is full, or the
        window ends. A lone caller on a quiet server goes straight through: no latency without load."""
        while not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        if waiting[0].params.seed is not None:
            return  # a seeded request is served alone
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._window
        head = waiting[0].key
        expect = self._peak.get(head, 0)
        if head in self._inflight:
            self._peak[head] = self._inflight[head]
        while True:
            same = [p for p in waiting if p.key == head]
            if len(same) >= expect or sum(p.sequences for p in same) >= self._max:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                waiting.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                return

    def _take(self, waiting: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
        live = [p for p in waiting if not p.future.done()]  # drop callers that timed out or left
        if not live:
            return [], []
        head, seqs = live[0].key, 0
        batch: list[_Pending] = []
        rest: list[_Pending] = []
        for p in live:
            if p.key == head and (not batch or seqs + p.sequences <= self._max):
                batch.append(p)
                seqs += p.sequences
            else:
                rest.append(p)
        return batch, rest

    async def _serve(self, batch: list[_Pending]) -> None:
        prompts = [s for p in batch for s in p.prompts]
        log.debug("batch: %d requests, %d prompts", len(batch), len(prompts))
        if self._observer:
            self._observer(len(batch), len(prompts))
        t0 = time.perf_counter()
        try:
            out = await self._generate(prompts, batch[0].params)
            log.debug("batch of %d prompts generated in %.1f ms", len(prompts), (time.perf_counter() - t0) * 1e3)
        except Exception as err:  # noqa: BLE001 - every caller of the batch gets the failure
            log.warning("batch of %d requests failed: %s", len(batch), err)
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
            return
        start = 0
        for p in batch:
            part = out.outputs[start : start + len(p.prompts)]
            start += len(p.prompts)
            if not p.future.done():
                p.future.set_result(GenerateOutput(out.weight_version, part))
