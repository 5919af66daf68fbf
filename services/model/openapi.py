"""The model server's OpenAPI document states this server's own bounds, not only the contract's: the
request limits of its settings (prompts or items per call, ``n``/``n_votes``, ``max_tokens``) and the
task names it can grade. A client, or a fuzzer, reading ``/openapi.json`` then knows what the server
accepts without trying; the exported ``proto/openapi/model_server.json`` shows the defaults."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from corl.tasks import task_names

from .settings import ServerSettings


def bound_schemas(schemas: dict[str, Any], settings: ServerSettings, judge_tasks: list[str] | None = None) -> None:
    """Write the settings' bounds into the request schemas of ``components.schemas`` (in place), and
    ``judge_tasks``, when known, as the tasks ``mode: judge`` accepts."""
    gen = schemas["GenerateRequest"]["properties"]
    gen["prompts"]["maxItems"] = settings.max_prompts
    gen["n"]["maximum"] = settings.max_n
    gen["max_tokens"]["maximum"] = settings.max_tokens
    # An omitted field gets the contract's default, lowered to the bound (ModelServing._omitted).
    for props, field, bound in (
        (gen, "max_tokens", settings.max_tokens),
        (schemas["GradeRequest"]["properties"], "n_votes", settings.max_n),
        (schemas["SamplingSettings"]["properties"], "max_tokens", settings.max_tokens),
    ):
        props[field]["default"] = min(props[field]["default"], bound)
    grade = schemas["GradeRequest"]["properties"]
    grade["items"]["maxItems"] = settings.max_prompts
    grade["n_votes"]["maximum"] = settings.max_n
    grade["task"]["enum"] = task_names()
    if judge_tasks is not None and judge_tasks != task_names():
        judge = {"properties": {"mode": {"const": "judge"}}, "required": ["mode"]}
        schemas["GradeRequest"]["if"] = judge
        schemas["GradeRequest"]["then"] = {"properties": {"task": {"enum": judge_tasks}}} if judge_tasks else False
    schemas["SamplingSettings"]["properties"]["max_tokens"]["maximum"] = settings.max_tokens
    _bound_openai(schemas, settings)


def _bound_openai(schemas: dict[str, Any], settings: ServerSettings) -> None:
    """The OpenAI routes: the same bounds, and the log-prob options this server cannot serve (0 only)."""
    chat, completion = schemas["ChatCompletionRequest"]["properties"], schemas["CompletionRequest"]["properties"]
    for props in (chat, completion):
        props["n"]["maximum"] = settings.max_n
    for prop in (chat["max_tokens"], chat["max_completion_tokens"]):
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == "integer":
                branch["maximum"] = settings.max_tokens
    completion["max_tokens"]["maximum"] = settings.max_tokens
    completion["max_tokens"]["default"] = min(completion["max_tokens"]["default"], settings.max_tokens)
    for branch in completion["prompt"].get("anyOf", []):
        if branch.get("type") == "array":
            branch["maxItems"] = settings.max_prompts
    for prop in (chat["top_logprobs"], completion["logprobs"]):
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == "integer":
                branch["maximum"] = 0


def publish_bounds(app: FastAPI, settings: ServerSettings) -> None:
    """Make ``app.openapi()`` (served at ``/openapi.json``) carry ``settings``' bounds, and the tasks
    the loaded model can judge."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()  # FastAPI keeps this document as app.openapi_schema
        serving = app.state.serving
        judge_tasks = serving.judge_tasks() if serving is not None else None
        bound_schemas(doc["components"]["schemas"], settings, judge_tasks)
        if judge_tasks is None:
            app.openapi_schema = None  # the model is not loaded yet: build it again once it is
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
