"""Items made on another thread (the transformers inference thread, vLLM's engine loop), read as
an async iterator on the server's loop: how a backend streams the tokens its engine decodes.

The producer calls ``push`` for each item and its job (a future on the reader's loop) ends after
the last push; ``items`` yields every pushed item, then the job's result. Pushes and the job's end
reach the reader's loop through ``call_soon_threadsafe`` in the order they happened, so the result
always comes last. A reader that leaves early cancels the job and makes the producer's next
``push`` raise ``Abandoned``, which stops work that cannot be cancelled (a decode loop in a thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Abandoned(Exception):
    """The reader has left: the producer should stop."""


@dataclass(frozen=True)
class _Ended:
    job: asyncio.Future[Any]


class Relay(Generic[T]):
    """Create on the reader's loop; ``push`` from any thread."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[T | _Ended] = asyncio.Queue()
        self._abandoned = threading.Event()

    def push(self, item: T) -> None:
        if self._abandoned.is_set():
            raise Abandoned
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def items(self, job: asyncio.Future[R]) -> AsyncIterator[T | R]:
        """Every pushed item, then ``job``'s result (or its exception)."""
        job.add_done_callback(lambda done: self._queue.put_nowait(_Ended(done)))
        try:
            while not isinstance(item := await self._queue.get(), _Ended):
                yield item
            yield item.job.result()
        finally:
            self._abandoned.set()
            job.cancel()  # a no-op once it is done
