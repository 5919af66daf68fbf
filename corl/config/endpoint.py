"""An outside OpenAI-compatible server as a cohort member (``members[].endpoint``)."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from corl.proto import EndpointApi

from .base import _Section


class EndpointConfig(_Section):
    """An outside OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama, TGI, a hosted API) as a
    member. Its key is read from the environment variable ``api_key_env`` names, never from this file."""

    api: EndpointApi = Field(
        default="openai-chat",
        description="openai-chat: POST {base_url}/chat/completions with the task prompt as system + user "
        "messages; openai-completions: POST {base_url}/completions with the task's plain template.",
    )
    base_url: str = Field(
        # No query string or user info: a key never rides in the URL (URLs are logged, keys never are).
        pattern=r"^https?://[^\s?#@]+$",
        description="The API root, e.g. http://127.0.0.1:8000/v1 (no query string, no user:password@).",
    )
    model: str = Field(min_length=1, description="The model name the server serves (the request's `model`).")
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key (sent as a Bearer token); None: no key.",
    )
    max_concurrency: int = Field(default=4, ge=1, description="Requests to this endpoint in flight at once.")
    timeout_s: float | None = Field(
        default=None, gt=0, description="Bound on one request, connect to last byte; None: rounds.request_timeout_s."
    )
    attempts: int = Field(default=4, ge=1, description="Tries of one request on 429, 5xx and connection errors.")
    max_retry_wait_s: float = Field(
        default=30.0, ge=0, description="Longest wait before a retry, Retry-After included (a longer one fails now)."
    )
    n: Literal["auto", "yes", "no"] = Field(
        default="auto",
        description="Whether one request may ask for n samples: auto: try it once and remember the answer; "
        "no: one request per sample (seeds differ).",
    )

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            # Said without echoing the value: it may be the key itself, pasted by mistake.
            raise ValueError("must name an environment variable (letters, digits, _); the key itself never goes here")
        return v

    def api_key(self) -> SecretStr | None:
        """The key from the environment; ``KeyError`` naming the variable when it is not set."""
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise KeyError(f"environment variable {self.api_key_env} (an endpoint's api_key_env) is not set")
        return SecretStr(value)
