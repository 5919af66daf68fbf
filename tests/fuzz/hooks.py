"""Schemathesis hooks, loaded by the CLI through ``SCHEMATHESIS_HOOKS`` (see ``support.run_schemathesis``).

Two runtime rules cannot be stated in JSON Schema. A rendered prompt plus its new tokens must fit
the model's context (tokens, not characters, and the template and system text are
request fields too). Bodies that break it are answered 422 by design (tests/unit/test_context_check.py)
but look schema-valid, so they are left out here, decided by the server's own functions. And
OpenRLHF's ``/get_reward`` takes one prompt per query (equal list lengths). A format that reads
prompts as conversations (``conversation: true``) needs each prompt to be one (a JSON document the
schema types as a string): other bodies are answered 422 by design and left out too. The gateway forwards to a
member its body names: generated bodies name one (``GATEWAY_MODEL_ENV``), so the forwarding path is fuzzed,
not only its 404.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import schemathesis

MODEL_DIR_ENV, CONTEXT_ENV = "CORL_FUZZ_MODEL_DIR", "CORL_FUZZ_MAX_CONTEXT"
GATEWAY_MODEL_ENV = "CORL_FUZZ_GATEWAY_MODEL"  # the gateway's fuzzing: a member name for generated bodies


@functools.cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.environ[MODEL_DIR_ENV])


def _texts(path: str, body: dict[str, Any]) -> tuple[list[str], int]:
    """The texts the server would render and the new tokens it would add, for one request body."""
    from corl.tasks import get_task

    if path == "/v1/generate":
        return list(body["prompts"]), int(body.get("max_tokens", 16))
    if path == "/v1/completions":
        prompt = body["prompt"]
        return ([prompt] if isinstance(prompt, str) else list(prompt)), int(body.get("max_tokens", 1))
    if path == "/v1/chat/completions":
        from corl.services.model.rendering import PromptRenderer

        messages = [{"role": m["role"], "content": _content(m["content"])} for m in body["messages"]]
        text = PromptRenderer(_tokenizer()).render_messages(messages)
        return [text], int(body.get("max_completion_tokens") or body.get("max_tokens") or 1)
    items = body["items"]
    if body.get("mode", "vote") == "judge":
        task = get_task(body["task"])
        return [task.judge_prompt(i["prompt"], i["response"]) for i in items], 1
    return [i["prompt"] for i in items], int(body.get("sampling", {}).get("max_tokens", 16))


def _content(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def _lengths_agree(body: dict[str, Any]) -> bool:
    """OpenRLHF's ``/get_reward``: one prompt (and label) per query, a rule JSON Schema cannot state."""
    query, prompts, labels = body.get("query"), body.get("prompts"), body.get("labels")
    if not isinstance(query, list) or not isinstance(prompts, list):
        return True  # not schema-valid anyway: the server must refuse it, so keep it
    return len(prompts) == len(query) and (not isinstance(labels, list) or len(labels) == len(query))


@schemathesis.hook
def filter_body(context: schemathesis.HookContext, body: Any) -> bool:
    path = context.operation.path if context.operation else ""
    if path == "/get_reward" and isinstance(body, dict):
        return _lengths_agree(body)
    if (
        path not in ("/v1/generate", "/v1/grade", "/v1/completions", "/v1/chat/completions")
        or MODEL_DIR_ENV not in os.environ
        or not isinstance(body, dict)
    ):
        return True
    from corl.proto import PromptFormat
    from corl.proto.conversation import NotAConversation
    from corl.services.model.backends.base import first_too_long
    from corl.services.model.rendering import PromptRenderer

    try:
        texts, max_tokens = _texts(path, body)
        rendered = PromptRenderer(_tokenizer()).render_all(texts, PromptFormat.model_validate(body.get("format", {})))
    except NotAConversation:
        return False
    except Exception:  # noqa: BLE001 - not a valid body: the server refuses it for another reason
        return True
    return first_too_long(_tokenizer(), rendered, max_tokens, int(os.environ[CONTEXT_ENV])) is None


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    model = os.environ.get(GATEWAY_MODEL_ENV)
    path = context.operation.path if context.operation else ""
    if model and path in ("/v1/completions", "/v1/chat/completions") and isinstance(body, dict):
        if isinstance(body.get("model"), str):
            return {**body, "model": model}
    return body
