"""Stopping a service's background loop (a harvest worker, the canary, the round driver)."""

from __future__ import annotations

import asyncio
import contextlib


async def stop_task(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has ended. A client library may swallow a cancellation that
    lands mid-command (redis-py's asyncio client can), and a loop that swallowed one runs on and
    waits at its next ``await`` forever: the cancel is repeated until the task ends."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)
    with contextlib.suppress(asyncio.CancelledError):
        await task  # its own error, if it failed, is the caller's to see
