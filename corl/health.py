"""Waiting until a service answers 200 on its health URL, failing at once if its process dies."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed


class NotReadyError(TimeoutError):
    """The URL did not answer 200 in time."""


def wait_healthy(
    url: str, timeout_s: float, *, alive: Callable[[], None] | None = None, interval_s: float = 0.5
) -> None:
    """Poll ``url`` until it answers 200. ``alive()`` runs before each try and raises when the
    service's process has died: that error propagates at once instead of waiting out the timeout."""
    try:
        for attempt in Retrying(
            stop=stop_after_delay(timeout_s),
            wait=wait_fixed(interval_s),
            retry=retry_if_exception_type((httpx.TransportError, _NotOk)),
            reraise=True,
        ):
            with attempt:
                if alive is not None:
                    alive()
                status = httpx.get(url, timeout=5.0).status_code
                if status != 200:
                    raise _NotOk(f"{url} answered {status}")
    except (httpx.TransportError, _NotOk) as err:
        raise NotReadyError(f"{url} not ready after {timeout_s:.0f}s: {err}") from None


def running(proc: subprocess.Popen, why: Callable[[], str] | None = None) -> Callable[[], None]:  # type: ignore[type-arg]
    """An ``alive`` check for ``wait_healthy``: raises ``RuntimeError`` once ``proc`` has exited, with
    ``why()`` (e.g. the tail of its log) in the message."""

    def check() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}" + (f": {why()}" if why else ""))

    return check


class _NotOk(Exception):
    pass
