"""Programs run by the sandbox service (``corl serve sandbox``) instead of in this process's own jail.

Where a service's host refuses the namespaces the jail needs (Docker's and Kubernetes' default seccomp
profiles), compose and Helm point it at a dedicated sandbox service with ``CORL_SANDBOX_URL`` (and its
token, ``CORL_SANDBOX_TOKEN``): a process that holds no secrets but that token, no data volume and no
egress, the only place code runs. Every ``run_python`` then goes there; the result is the same
``SandboxResult``. An unreachable or refusing service raises ``SandboxUnavailable`` (fail closed).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from corl.proto import ProgramLimits, RunProgramRequest, RunProgramResponse

from .jail import SandboxUnavailable

SANDBOX_URL_ENV = "CORL_SANDBOX_URL"
SANDBOX_TOKEN_ENV = "CORL_SANDBOX_TOKEN"


@functools.lru_cache(maxsize=4)
def _client(url: str) -> httpx.Client:
    """One pooled client per service for the life of the process (threads share it: httpx is thread-safe)."""
    return httpx.Client(base_url=url, timeout=httpx.Timeout(60.0, connect=5.0))


def remote_url() -> str | None:
    """The sandbox service this process sends its programs to, or None (its own jail)."""
    url = os.environ.get(SANDBOX_URL_ENV, "").strip()
    return url.rstrip("/") or None


def run_remote(url: str, code: str, limits: Mapping[str, Any]) -> RunProgramResponse:
    """How ``code`` ended, run by the service at ``url`` under ``limits`` (a ``Limits`` as a dict: the
    service runs programs as its own unprivileged user, so ``uid`` does not travel)."""
    fields = {k: v for k, v in limits.items() if k in ProgramLimits.model_fields}
    body = RunProgramRequest(source=code, limits=ProgramLimits(**fields)).model_dump(mode="json")
    token = os.environ.get(SANDBOX_TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(float(fields.get("timeout_s", 10.0)) + 30.0, connect=5.0)
    try:
        # Sent again only when it never reached the service (a read timeout means it may have run).
        for attempt in Retrying(
            stop=stop_after_attempt(3),
            wait=wait_exponential(multiplier=0.5, max=4),
            retry=retry_if_exception_type((httpx.ConnectError, httpx.ConnectTimeout)),
            reraise=True,
        ):
            with attempt:
                reply = _client(url).post("/v1/run", json=body, headers=headers, timeout=timeout)
    except httpx.TransportError as err:
        raise SandboxUnavailable(f"the sandbox service at {url} cannot be reached: {err}") from err
    if reply.status_code != 200:
        raise SandboxUnavailable(
            f"the sandbox service at {url} refused the program: {reply.status_code} {reply.text[:300]}"
        )
    return RunProgramResponse.model_validate_json(reply.content)
