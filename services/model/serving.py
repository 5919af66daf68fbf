"""The serving layer: request bounds, dynamic batching, token streams, vote and judge grading,
weight updates.

Routes call this and nothing else; it calls the backend. Anything every backend should get for
free lives here (vote grading, bounds, timeouts, metrics), so backends stay small.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from corl import weights_store
from corl.proto import (
    GenerateRequest,
    GenerateResponse,
    GradeRequest,
    GradeResponse,
    InfoResponse,
    PromptFormat,
    WeightUpdateRequest,
    WeightUpdateResponse,
)
from corl.services.errors import ForbiddenError, InvalidInputError, ServiceError, UnavailableError
from corl.tasks import Task, extract_all, get_task, task_names

from .backends.base import Backend, BackendError, GenerateOutput, SamplingParams, StaleVersionError, WeightLoadError
from .batching import GenerateBatcher
from .metrics import ServerMetrics
from .rendering import PromptRenderer
from .settings import ServerSettings
from .token_stream import TokenStream

log = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ModelServing:
    def __init__(self, settings: ServerSettings, backend: Backend, metrics: ServerMetrics) -> None:
        self.settings = settings
        self.backend = backend
        self.metrics = metrics
        self._ready = asyncio.Event()
        self._swap_lock = asyncio.Lock()
        self._batcher: GenerateBatcher | None = None
        self._renderer: PromptRenderer | None = None
        self._tasks: dict[str, Task] = {}
        self.detokenizer: Any = None
        self._judge_tasks: list[str] | None = None
        self.start_error: BaseException | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def start(self) -> None:
        try:
            await self.backend.start()
            self._renderer = PromptRenderer(self.backend.tokenizer)
            log.info("%s: %s", self.settings.member_name, self._renderer.describe())
            # Decoding for the OpenAI routes runs in worker threads beside the inference thread, and a
            # Rust tokenizer busy encoding cannot be borrowed at the same time: they get their own copy.
            self.detokenizer = copy.deepcopy(self.backend.tokenizer)
        except Exception as err:
            self.start_error = err
            log.exception("backend failed to start")
            raise
        if self.backend.wants_batching:
            b = self.settings.batch
            self._batcher = GenerateBatcher(
                self.backend.generate,
                window_s=b.window_ms / 1000,
                max_sequences=b.max_sequences,
                observer=self._observe_batch,
            )
            self._batcher.start()
        self.metrics.weight_version.set(self.backend.weight_version)
        self.metrics.ready.set(1)
        self._ready.set()

    async def wait_ready(self, timeout: float) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def close(self) -> None:
        if self._batcher:
            await self._batcher.close()
        await self.backend.close()

    def _observe_batch(self, requests: int, prompts: int) -> None:
        self.metrics.batch_requests.observe(requests)
        self.metrics.batch_size.observe(prompts)

    def require_ready(self) -> None:
        if not self.ready:
            raise UnavailableError(
                "model is not loaded yet" if self.start_error is None else f"backend failed: {self.start_error}"
            )

    async def _bounded(self, work: Awaitable[T], timeout: float, what: str) -> T:
        try:
            async with asyncio.timeout(timeout):  # no extra task per call, unlike wait_for
                return await work
        except TimeoutError:
            raise UnavailableError(f"{what} took longer than {timeout:.0f}s") from None
        except ServiceError:
            raise
        except Exception as err:  # noqa: BLE001 - an engine failure is the server's, not the caller's
            log.exception("backend %s failed", what)
            raise BackendError(f"{what} failed: {type(err).__name__}: {err}") from err

    async def _generate(self, prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        call = self._batcher.submit(prompts, params) if self._batcher else self.backend.generate(prompts, params)
        out = await self._bounded(call, self.settings.request_timeout_s, "generate")
        self._count_tokens(out)
        return out

    def _count_tokens(self, out: GenerateOutput) -> None:
        self.metrics.generated_tokens.inc(sum(len(c.token_ids) for o in out.outputs for c in o.completions))

    # --- bounds and rendering -----------------------------------------------------------------
    def _check_count(self, count: int, field: str) -> None:
        if count > self.settings.max_prompts:
            raise InvalidInputError(
                f"{field}: {count} entries, this server allows at most {self.settings.max_prompts}", field
            )

    def _omitted(self, model: M, bounds: dict[str, int]) -> M:
        """Fields the request leaves out take the contract's default lowered to this server's bound
        (the default the published schema shows): leaving a field out never gets a request refused."""
        update = {f: min(getattr(model, f), b) for f, b in bounds.items() if f not in model.model_fields_set}
        return model.model_copy(update=update) if update else model

    def _check_n(self, n: int, field: str, prompts: int = 1) -> None:
        if n > self.settings.max_n:
            raise InvalidInputError(f"{field}={n} exceeds this server's bound {self.settings.max_n}", field)
        if n * prompts > self.settings.max_rows:
            raise InvalidInputError(
                f"{prompts} prompts x {field}={n} = {n * prompts} sequences, this server decodes at most "
                f"{self.settings.max_rows} per call",
                field,
            )

    def served_tasks(self) -> list[str]:
        """The tasks ``/v1/grade`` serves: ``CORL_TASKS``, or every task but code (it runs programs)."""
        if self.settings.tasks:
            return [t.strip() for t in self.settings.tasks.split(",") if t.strip()]
        return [t for t in task_names() if not get_task(t).runs_code]

    def _check_max_tokens(self, max_tokens: int, field: str) -> None:
        if max_tokens > self.settings.max_tokens:
            raise InvalidInputError(
                f"{field}={max_tokens} exceeds this server's bound {self.settings.max_tokens}", field
            )

    def _render(self, prompts: Sequence[str], fmt: PromptFormat, max_tokens: int, field: str) -> list[str]:
        """The member's rendering of each prompt, checked against its context length."""
        assert self._renderer is not None
        try:
            texts = self._renderer.render_all(prompts, fmt)
        except ValueError as err:  # a conversation-format prompt that carries no conversation
            raise InvalidInputError(str(err), field) from None
        i = self.backend.too_long(texts, max_tokens)
        if i is not None:
            raise InvalidInputError(
                f"{field}[{i}] plus {max_tokens} new tokens exceeds the model's context", f"{field}.{i}"
            )
        return texts

    def _task(self, name: str) -> Task:
        if name not in self.served_tasks():
            raise ForbiddenError(f"task {name!r} is not served here; this server grades {self.served_tasks()}", "task")
        if name not in self._tasks:
            try:
                self._tasks[name] = get_task(name)
            except ValueError as err:
                raise InvalidInputError(str(err), "task") from None
        return self._tasks[name]

    @property
    def renderer(self) -> PromptRenderer:
        self.require_ready()
        assert self._renderer is not None
        return self._renderer

    def _check_sampling(self, texts: list[str], params: SamplingParams, field: str) -> None:
        self._check_count(len(texts), field)
        self._check_n(params.n, "n", len(texts))
        self._check_max_tokens(params.max_tokens, "max_tokens")
        self.require_ready()
        i = self.backend.too_long(texts, params.max_tokens)
        if i is not None:
            raise InvalidInputError(f"{field} plus {params.max_tokens} new tokens exceeds the model's context", field)

    async def sample(self, texts: list[str], params: SamplingParams, field: str) -> GenerateOutput:
        """Rendered ``texts`` through the bounds, context check and batcher of ``/v1/generate`` (the
        OpenAI routes' way in); ``field`` names the request field the texts came from."""
        self._check_sampling(texts, params, field)
        return await self._generate(texts, params)

    async def stream(self, texts: list[str], params: SamplingParams, field: str) -> TokenStream:
        """``sample`` as it decodes (``stream: true``): the same bounds and context check, then the
        backend's own stream, which leases one weight version until its last token (no batcher: a
        stream is one backend call). Returns once the first step has arrived, so a failure up to
        then is an ordinary error; ``request_timeout_s`` bounds the whole generation."""
        self._check_sampling(texts, params, field)
        loop = asyncio.get_running_loop()
        start = loop.time()

        def bounded(step: Awaitable[T]) -> Awaitable[T]:
            return self._bounded(step, start + self.settings.request_timeout_s - loop.time(), "generate")

        stream = await TokenStream.open(self.backend.stream(texts, params), bounded, self._count_tokens)
        self.metrics.stream_first_token.observe(loop.time() - start)
        return stream

    # --- endpoints ----------------------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> GenerateResponse:
        req = self._omitted(req, {"max_tokens": self.settings.max_tokens})
        self._check_count(len(req.prompts), "prompts")
        self._check_n(req.n, "n", len(req.prompts))
        self._check_max_tokens(req.max_tokens, "max_tokens")
        self.require_ready()
        texts = self._render(req.prompts, req.format, req.max_tokens, "prompts")
        params = SamplingParams(
            n=req.n,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=tuple(req.stop),
            seed=req.seed,
        )
        out = await self._generate(texts, params)
        # One validation pass over the backend's objects (read by attribute): half the cost of building
        # 128 Sample models one by one, which is as much as the HTTP round trip itself.
        return GenerateResponse.model_validate(
            {
                "model": self.backend.name,
                "weight_version": out.weight_version,
                "results": [
                    {"prompt": prompt, "prompt_token_ids": o.prompt_token_ids, "samples": o.completions}
                    for prompt, o in zip(req.prompts, out.outputs, strict=True)
                ],
            },
            from_attributes=True,
        )

    async def grade(self, req: GradeRequest) -> GradeResponse:
        sampling = self._omitted(req.sampling, {"max_tokens": self.settings.max_tokens})
        req = self._omitted(req, {"n_votes": self.settings.max_n}).model_copy(update={"sampling": sampling})
        self._check_count(len(req.items), "items")
        self._check_n(req.n_votes, "n_votes", len({item.prompt for item in req.items}))
        task = self._task(req.task)
        self.require_ready()
        if req.mode == "vote":
            version, scores = await self._vote(req, task)
        else:
            if req.rubric is not None:
                try:
                    task = get_task(req.task, req.rubric)
                except ValueError as err:
                    raise InvalidInputError(str(err), "rubric") from None
            version, scores = await self._judge(req, task)
        return GradeResponse(model=self.backend.name, weight_version=version, scores=scores)

    async def _vote(self, req: GradeRequest, task: Task) -> tuple[int, list[float]]:
        """Score = fraction of the server's own ``n_votes`` answers that agree with the response's."""
        sp = req.sampling
        self._check_max_tokens(sp.max_tokens, "sampling.max_tokens")
        prompts = list(dict.fromkeys(item.prompt for item in req.items))  # each prompt sampled once
        texts = self._render(prompts, req.format, sp.max_tokens, "items")
        params = SamplingParams(
            n=req.n_votes, max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p, stop=tuple(sp.stop)
        )
        out = await self._generate(texts, params)

        def score() -> list[float]:  # answer extraction may run programs (code): off the event loop, batched
            own_pairs = [(p, c.text) for p, o in zip(prompts, out.outputs, strict=True) for c in o.completions]
            item_pairs = [(item.prompt, item.response) for item in req.items]
            answers = extract_all(task, own_pairs + item_pairs)
            votes: dict[str, list[str | None]] = {p: [] for p in prompts}
            for (p, _), a in zip(own_pairs, answers, strict=False):
                votes[p].append(a)
            scores = []
            for item, answer in zip(req.items, answers[len(own_pairs) :], strict=True):
                own = votes[item.prompt]
                scores.append(0.0 if answer is None else sum(v == answer for v in own) / len(own))
            return scores

        return out.weight_version, await asyncio.to_thread(score)

    def judge_tasks(self) -> list[str] | None:
        """Tasks this model can judge (each verdict one token of its tokenizer); None until it is loaded."""
        if not self.ready:
            return None
        if self._judge_tasks is None:
            self._judge_tasks = [n for n in self.served_tasks() if self.backend.judges(self._task(n).verdict_tokens)]
        return self._judge_tasks

    async def _judge(self, req: GradeRequest, task: Task) -> tuple[int, list[float]]:
        if req.task not in (self.judge_tasks() or ()):
            raise InvalidInputError(
                f"task {req.task!r} cannot be judged by {self.backend.name}: its verdicts "
                f"{list(task.verdict_tokens)} are not single tokens of this model's tokenizer",
                "task",
            )
        judge_texts = [task.judge_prompt(item.prompt, item.response) for item in req.items]
        texts = self._render(judge_texts, req.format.judging(), 1, "items")
        correct, incorrect = task.verdict_tokens
        out = await self._bounded(
            self.backend.judge(texts, correct, incorrect), self.settings.request_timeout_s, "judge"
        )
        return out.weight_version, [min(1.0, max(0.0, s)) for s in out.scores]

    def _check_in_store(self, uri: str) -> None:
        """403 for a directory outside ``weights_root``, judged after resolving links and ``..``, so
        a symlink in the store that points elsewhere is refused too."""
        root = self.settings.weights_root
        if root is None:
            return
        try:
            inside = Path(uri).resolve().is_relative_to(root.resolve())
        except (OSError, ValueError, RuntimeError) as err:  # a NUL byte, a symlink loop
            raise InvalidInputError(f"uri {uri!r} is not a usable path: {err}", "uri") from None
        if not inside:
            raise ForbiddenError(f"uri {uri!r} is outside this server's weights store {str(root)!r}", "uri")

    async def update_weights(self, req: WeightUpdateRequest) -> WeightUpdateResponse:
        self._check_in_store(req.uri)
        self.require_ready()
        # The faster digest of the same bytes when the trainer sent one (corl.weights_store).
        checksum = f"{weights_store.XXH3_PREFIX}{req.xxh3_128}" if req.xxh3_128 else req.sha256
        async with self._swap_lock:
            previous = self.backend.weight_version
            try:
                if req.version <= previous:
                    raise StaleVersionError(f"version {req.version} is not newer than the serving version {previous}")
                seconds = await self._bounded(
                    self.backend.load_weights(req.version, req.uri, req.format, checksum),
                    self.settings.swap_timeout_s,
                    "weight load",
                )
            except (StaleVersionError, WeightLoadError) as err:
                self.metrics.weight_updates.labels(
                    "conflict" if isinstance(err, StaleVersionError) else "invalid"
                ).inc()
                raise
            except Exception:
                self.metrics.weight_updates.labels("error").inc()
                raise
        self.metrics.weight_updates.labels("ok").inc()
        self.metrics.weight_version.set(req.version)
        self.metrics.last_swap_duration.set(seconds)
        log.info("weights %d -> %d in %.3fs", previous, req.version, seconds)
        return WeightUpdateResponse(weight_version=req.version, previous_version=previous, swap_seconds=seconds)

    def info(self) -> InfoResponse:
        b = self.backend
        return InfoResponse(
            name=b.name,
            family=b.family,
            parameters=b.parameters,
            weight_version=b.weight_version,
            backend=b.kind,
            chat_template=self._renderer.has_chat_template if self._renderer else False,
            max_context=b.max_context,
        )
