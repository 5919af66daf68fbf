"""Prompt sources. Every source is addressed by an integer cursor persisted with the round state, so
a retried round takes exactly the same prompts and a restarted aggregator continues where it was.

- ``task``: the seeded RL split of the task's data source (``task.source``: a packaged data set, a
  reasoning-gym generator, a local file; default the task's own generator), cycled;
- ``jsonl``: a file of ``{"prompt", "answer"?}`` records, cycled;
- ``http``: prompts posted to ``POST /v1/prompts``, kept in a Redis list and consumed once, in order;
- ``harvest``: the conversations the gateway harvested (a Redis stream): each round takes the newest
  ones above the cursor (the stream id of the newest taken, as an integer), within their retention.

Dataset answers ride along for diagnostics only (and the explicit ``ground_truth`` baseline).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
from pydantic import ValidationError

from corl import redis_keys as keys
from corl.config import CohortConfig
from corl.data import load_splits
from corl.proto import PromptRecord
from corl.proto.gateway import HarvestedPrompt
from corl.services.errors import ConflictError
from corl.tasks import Example, Task, get_task
from corl.tasks.chat import conversation_of
from corl.tasks.echo import LIMIT, echo_graded_correct

log = logging.getLogger(__name__)
ECHO_LINT_ITEMS = 100  # labelled prompts the start-up echo lint grades (the code task runs programs for it)


class PromptSource(Protocol):
    kind: str

    async def take(self, cursor: int, n: int) -> list[Example]:
        """Up to ``n`` prompts starting at ``cursor`` (fewer, or none, only for a consumable source)."""
        ...

    def next_cursor(self, cursor: int, taken: list[Example]) -> int:
        """The cursor after a round that took ``taken`` from ``cursor``."""
        ...


class _Counted:
    """A source whose cursor counts the prompts taken."""

    def next_cursor(self, cursor: int, taken: list[Example]) -> int:
        return cursor + len(taken)


class CyclicSource(_Counted):
    """A fixed list of examples read round-robin."""

    def __init__(self, kind: str, examples: list[Example]):
        if not examples:
            raise ValueError(f"prompt source {kind!r} has no prompts")
        self.kind = kind
        self._examples = examples

    async def take(self, cursor: int, n: int) -> list[Example]:
        ex, size = self._examples, len(self._examples)
        return [ex[(cursor + i) % size] for i in range(n)]


class PostedSource(_Counted):
    """Prompts posted over HTTP, appended to a Redis list; the cursor is an index into it."""

    kind = "http"

    def __init__(self, redis: aioredis.Redis, run: str, conversations: bool = False):
        self._redis = redis
        self._key = keys.posted_prompts(run)
        self._conversations = conversations  # the task's prompts are conversations: a plain one is a user turn

    async def take(self, cursor: int, n: int) -> list[Example]:
        raw = await self._redis.lrange(self._key, cursor, cursor + n - 1)
        examples = [_example(PromptRecord.model_validate_json(r)) for r in raw]
        return [_conversational(e) for e in examples] if self._conversations else examples

    async def post(self, records: list[PromptRecord]) -> int:
        """Append prompts; returns the list's new length."""
        return int(await self._redis.rpush(self._key, *(r.model_dump_json() for r in records)))


def _example(r: PromptRecord) -> Example:
    return Example(r.prompt, r.answer)


_SEQ_BITS = 20  # a stream id ``<ms>-<seq>`` as one integer: ms << 20 | seq (a million entries per ms)
HARVEST_ID = "harvest_id"  # Example.meta key: the pool id of a harvested conversation


def _cursor_of(stream_id: bytes | str) -> int:
    ms, _, seq = (stream_id.decode() if isinstance(stream_id, bytes) else stream_id).partition("-")
    return int(ms) << _SEQ_BITS | int(seq or 0)


def _stream_id(cursor: int) -> str:
    return f"{cursor >> _SEQ_BITS}-{cursor & ((1 << _SEQ_BITS) - 1)}"


class HarvestSource:
    """The gateway's prompt pool (``corl.services.gateway``): each round the newest conversations above
    the cursor and within the retention bound, oldest first; a round waits for ``min_prompts``. A
    conversation is taken once; one older than the newest taken is passed over for good."""

    kind = "harvest"

    def __init__(self, redis: aioredis.Redis, run: str, retention_s: float, min_prompts: int) -> None:
        self._redis, self._key = redis, keys.harvest_pool(run)
        self.retention_s, self.min_prompts = retention_s, min_prompts

    async def take(self, cursor: int, n: int) -> list[Example]:
        floor = max(cursor, _cursor_of(f"{int((time.time() - self.retention_s) * 1000)}-0"))
        entries: Any = await self._redis.xrevrange(self._key, max="+", min=f"({_stream_id(floor)}", count=n)
        if len(entries) < self.min_prompts:
            return []
        out = []
        for sid, fields in reversed(entries):
            entry = HarvestedPrompt.model_validate_json(fields[b"prompt"])
            out.append(Example(entry.conversation.encode(), meta={HARVEST_ID: entry.id, "cursor": _cursor_of(sid)}))
        return out

    def next_cursor(self, cursor: int, taken: list[Example]) -> int:
        return max([cursor, *(int(e.meta["cursor"]) for e in taken)])


def read_jsonl(path: str | Path) -> list[Example]:
    examples = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            examples.append(_example(PromptRecord.model_validate_json(line)))
        except ValidationError as err:
            raise ValueError(f"{path}:{lineno}: not a {{prompt, answer?}} record: {err}") from None
    return examples


def build_prompt_source(cfg: CohortConfig, redis: aioredis.Redis) -> PromptSource:
    src = cfg.rounds.prompt_source
    if src.kind == "task":
        splits = load_splits(cfg.task, src.seed)  # read once at start-up, before the service is ready
        examples = splits.rl if src.split == "rl" else splits.eval
        lint_echo(get_task(cfg.task.name), examples)
        return CyclicSource("task", examples)
    conversations = get_task(cfg.task.name).prompt_format.conversation
    if src.kind == "jsonl":
        assert src.path is not None  # checked by the config
        examples = read_jsonl(src.path)
        return CyclicSource("jsonl", [_conversational(e) for e in examples] if conversations else examples)
    if src.kind == "harvest":
        return HarvestSource(redis, cfg.run_id, cfg.gateway.harvest.retention_s, src.min_prompts)
    return PostedSource(redis, cfg.run_id, conversations)


def _conversational(e: Example) -> Example:
    """A plain prompt for a task whose prompts are conversations (chat): one user turn."""
    return Example(conversation_of(e.prompt).encode(), e.answer, e.meta)


def lint_echo(task: Task, examples: list[Example]) -> float:
    """Warn when a response that only restates the prompt would be graded right on these prompts: the
    reward would then pay for echoing (``corl.tasks.echo``). Returns the measured share."""
    share = echo_graded_correct(task, examples[:ECHO_LINT_ITEMS])
    if share > LIMIT:
        log.warning(
            "echo lint: a response that only restates the prompt is graded correct on %.1f%% of the %s task's "
            "prompts (limit %.0f%%): its reader computes answers from the text, and rewards will pay for echoing",
            100 * share, task.name, 100 * LIMIT,
        )  # fmt: skip
    return share


def posted_source(source: PromptSource) -> PostedSource:
    if not isinstance(source, PostedSource):
        raise ConflictError(f"this run reads prompts from its {source.kind!r} source, not from POST /v1/prompts")
    return source
