"""When a request to an outside endpoint is sent again, and after how long.

429 and 5xx replies and connection errors are retried (sampling and judging have no effect on the
server) with exponential backoff and jitter, or after the reply's ``Retry-After`` (seconds or an
HTTP date) when it gives one; a ``Retry-After`` longer than ``max_wait_s`` fails the request at once
(the round goes on without the member). A read timeout is not retried: a server too slow once will
be slow again in this round. Any other 4xx would get the same answer again.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_random_exponential


def retry_after_s(exc: BaseException) -> float | None:
    """Seconds a 429 or 5xx reply asks the client to wait, from its ``Retry-After`` header."""
    if not isinstance(exc, httpx.HTTPStatusError):
        return None
    value = exc.response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def retryable(exc: BaseException, max_wait_s: float) -> bool:
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        if status != 429 and status < 500:
            return False
        wait = retry_after_s(exc)
        return wait is None or wait <= max_wait_s
    if isinstance(exc, httpx.ReadTimeout):
        return False
    return isinstance(exc, httpx.TransportError)


def retrying(
    attempts: int, backoff_initial_s: float, max_wait_s: float, before_sleep: Callable[[RetryCallState], None]
) -> AsyncRetrying:
    backoff = wait_random_exponential(multiplier=backoff_initial_s, max=max_wait_s)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        asked = retry_after_s(exc) if exc is not None else None
        return backoff(state) if asked is None else asked

    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait,
        retry=retry_if_exception(lambda e: retryable(e, max_wait_s)),
        before_sleep=before_sleep,
        reraise=True,
    )
