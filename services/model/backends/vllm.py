"""The vLLM backend: vLLM's async engine behind the same contract as the transformers backend.

Generation: rendered prompts are tokenised here as the transformers backend does (no special
tokens added) and sent as token ids; vLLM batches concurrent requests itself, so the serving layer
does not merge them (``wants_batching = False``). Log-probs are vLLM's ``processed_logprobs``:
after temperature and top-p, the distribution each token was drawn from. Judge scores read the two
verdict tokens' log-probs of the next token; the softmax normaliser cancels in P(c)/(P(c)+P(i)).

Weights (checked by ``weights.py`` while the old weights serve): a full swap then closes admission,
waits for the requests in flight (they finish on the old weights and report the old version),
re-checks that the files were not rewritten, loads them in place (the workers' ``reload_weights``:
no restart), resets the prefix cache and reopens; requests that arrive meanwhile wait, none fails.
A load that fails inside vLLM is undone by reloading the previous directory. On GPUs a full version
may also come by broadcast from the member's weight group (``receive_weights``; the engine's workers
hold the group through ``vllm_transfer.TransferWorker``): checked as files are, then drained, each
tensor loaded as it lands, fingerprints compared, the prefix cache reset, flipped; a transfer that
fails reloads the previous version's files. Written for GPUs and not run here (no GPU, no vLLM in
this environment). A LoRA update needs no
drain: running requests keep their adapter, new ones get the new adapter under a new name per
version. Architectures without vLLM LoRA support (GPT-2, Mamba) get the adapter merged on the CPU
and swapped in as full weights. A stream is one request in ``DELTA`` mode, admitted like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from corl import weights_store
from corl.transfer import GroupSpec, dtype_name
from corl.transfer.shared import SharedRef

from . import adapters, weights
from .base import (
    Backend,
    BackendError,
    GenerateOutput,
    GroupUnsupportedError,
    JudgeOutput,
    Manifest,
    SamplingParams,
    StaleVersionError,
    Streamed,
    StreamStep,
    TokenDelta,
    TransferAbortedError,
    WeightFormat,
    WeightGroupError,
    WeightLoadError,
    single_token_id,
)
from .relay import Relay
from .vllm_admission import Admission, Serving
from .vllm_engine import EngineOptions, VLLMEngine
from .vllm_requests import Gathered, generate_output, judge_params, judge_scores, sampled_logprobs, sampling_params

log = logging.getLogger(__name__)

_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "embeddings.weight", "word_embeddings.weight")


class VLLMBackend(Backend):
    kind = "vllm"
    wants_batching = False

    def __init__(
        self,
        model_dir: str,
        name: str,
        initial_version: int = 0,
        *,
        engine: VLLMEngine | None = None,
        options: EngineOptions | None = None,
    ) -> None:
        """``engine``: an engine started elsewhere for the same ``model_dir``; this backend loads
        the initial weights into it and leaves it running on ``close``. It takes no ``device`` or
        ``num_threads`` (the transformers backend's knobs): vLLM places and threads itself."""
        super().__init__(model_dir, name, initial_version)
        self._own_engine = engine is None
        self._engine = engine or VLLMEngine(self._model_dir, options)
        self._gate = Admission(Serving(initial_version), self._remove_lora)
        self._swap_lock = asyncio.Lock()
        self._merged_dir: str | None = None  # CPU-merged LoRA weights now serving (non-LoRA archs)
        self._failed: str | None = None
        self._group: str | None = None  # the weight group the engine's workers are in

    @property
    def weight_version(self) -> int:
        return self._gate.serving.version

    @property
    def peak_inflight(self) -> int:
        """Most requests in the engine at once (continuous batching at work)."""
        return self._gate.peak_inflight

    @property
    def max_context(self) -> int | None:
        return self._engine.max_model_len

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._read_model)
        if self._own_engine:
            await asyncio.to_thread(self._engine.start)
        else:  # a shared engine: back to the initial weights, no adapters, nothing cached
            if self._engine.lora_enabled:
                for lora_id in await self._engine.run(self._engine.llm.list_loras()):
                    await self._engine.run(self._engine.llm.remove_lora(lora_id))
            if self._engine.weights_path != self._model_dir:
                await self._reload(self._model_dir)
            await self._engine.run(self._engine.llm.reset_prefix_cache())
        log.info(
            "vLLM serving %s (%s, %d parameters), version %d",
            self.name,
            self.family,
            self.parameters,
            self.weight_version,
        )

    def _read_model(self) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self._model_dir)
        config = AutoConfig.from_pretrained(self._model_dir)
        self.family = str(config.model_type)
        spec = weights.files_spec(weights_store.safetensors_files(self._model_dir))
        self.parameters = sum(math.prod(s) for s in spec.values())
        embed = next((k for k in spec if k.endswith(_EMBEDDINGS)), None)
        if getattr(config, "tie_word_embeddings", False) and embed and "lm_head.weight" not in spec:
            # A tied lm_head is saved once, as the embeddings; an update may carry either name.
            spec["lm_head.weight"] = spec[embed]
            self._aliases = dict.fromkeys(("lm_head.weight", embed), frozenset(("lm_head.weight", embed)))
        self._reference = spec

    async def close(self) -> None:
        if self._own_engine:
            await asyncio.to_thread(self._engine.shutdown)
        if self._merged_dir:
            shutil.rmtree(self._merged_dir, ignore_errors=True)
            self._merged_dir = None

    # --- admission ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[Serving]:
        async with self._gate.held() as serving:
            if self._failed:
                raise BackendError(self._failed)
            yield serving

    async def _remove_lora(self, lora_id: int) -> None:
        try:
            await self._engine.run(self._engine.llm.remove_lora(lora_id))
        except Exception:  # noqa: BLE001 - an adapter left loaded only costs memory until evicted
            log.warning("%s: could not unload LoRA adapter %d", self.name, lora_id, exc_info=True)

    # --- inference ----------------------------------------------------------------------------
    def _encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]

    async def generate(self, prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        sp = sampling_params(params, streamed=False)
        ids = self._encode(prompts)
        async with self._admitted() as serving:
            finals = await self._engine.run(self._run_all(ids, sp, serving.lora))
        return generate_output(serving.version, ids, finals, params, self.tokenizer)

    async def stream(self, prompts: Sequence[str], params: SamplingParams) -> Streamed:
        sp = sampling_params(params, streamed=True)
        ids = self._encode(prompts)
        relay: Relay[StreamStep] = Relay()
        job = asyncio.ensure_future(self._stream_admitted(ids, sp, params, relay.push))
        async for item in relay.items(job):
            yield item

    async def _stream_admitted(
        self, ids: list[list[int]], sp: Any, params: SamplingParams, push: Callable[[StreamStep], None]
    ) -> GenerateOutput:
        """The serving weights are held while the engine decodes (not while a slow reader reads on)."""
        copies = params.n if params.temperature == 0.0 else 1  # greedy: one completion stands for n
        async with self._admitted() as serving:

            def on_delta(prompt: int, c: Any) -> None:  # on the engine loop
                first, tokens, logprobs = (prompt * sp.n + c.index) * copies, list(c.token_ids), sampled_logprobs(c)
                push(StreamStep(serving.version, [TokenDelta(first + k, tokens, logprobs) for k in range(copies)]))

            gathers = [Gathered(sp.n, functools.partial(on_delta, p)) for p in range(len(ids))]
            finals = await self._engine.run(self._run_all(ids, sp, serving.lora, gathers))
        return generate_output(serving.version, ids, finals, params, self.tokenizer)

    async def _run_all(self, ids: list[list[int]], sp: Any, lora: Any, gathers: Sequence[Any] = ()) -> list[Any]:
        """On the engine loop: one vLLM request per prompt, all in flight together."""
        gathers = gathers or [None] * len(ids)
        return await asyncio.gather(*(self._run_one(p, sp, lora, g) for p, g in zip(ids, gathers, strict=True)))

    async def _run_one(self, prompt_ids: list[int], sp: Any, lora: Any, gather: Gathered | None = None) -> Any:
        """The request's final output, or (streamed) the one ``gather`` puts together from its deltas."""
        from vllm.inputs import TokensPrompt

        final = None
        try:
            async for out in self._engine.llm.generate(
                TokensPrompt(prompt_token_ids=prompt_ids), sp, uuid.uuid4().hex, lora_request=lora
            ):
                final = out if gather is None else gather.add(out)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            raise BackendError(f"vLLM request failed: {type(err).__name__}: {err}") from err
        if final is None or len(final.outputs) != sp.n:
            raise BackendError("vLLM returned no final output")
        return final

    async def judge(self, texts: Sequence[str], correct_token: str, incorrect_token: str) -> JudgeOutput:
        c, i = self._single_token(correct_token), self._single_token(incorrect_token)
        ids = self._encode(texts)
        async with self._admitted() as serving:
            finals = await self._engine.run(self._run_all(ids, judge_params(c, i), serving.lora))
        return JudgeOutput(serving.version, judge_scores(finals, c, i))

    def _single_token(self, text: str) -> int:
        return single_token_id(self.tokenizer, text, self.name)

    # --- weights ------------------------------------------------------------------------------
    async def load_weights(self, version: int, path: str, fmt: WeightFormat, sha256: str) -> float:
        async with self._swap_lock:
            weights.check_newer(version, self.weight_version)
            if self._failed:
                raise BackendError(self._failed)
            t0 = time.perf_counter()
            if fmt == "full":
                checked = await asyncio.to_thread(weights.verify_full, path, sha256, self._reference, self._aliases)
                await self._swap_full(version, path, checked)
            elif self._engine.lora_enabled:
                await asyncio.to_thread(weights.verify_adapter, path, sha256)
                await self._swap_lora(version, path)
            else:
                merged = await asyncio.to_thread(self._merge_lora, path, sha256)
                try:
                    await self._swap_full(version, merged, weights.files_of(merged))
                except BaseException:
                    shutil.rmtree(merged, ignore_errors=True)
                    raise
                old, self._merged_dir = self._merged_dir, merged
                if old:
                    shutil.rmtree(old, ignore_errors=True)
            seconds = time.perf_counter() - t0
            log.info("%s: swapped to weight version %d (%s) in %.3fs", self.name, version, fmt, seconds)
            return seconds

    async def _swap_full(self, version: int, path: str, checked: tuple[list[Any], weights.FileStates]) -> None:
        async with self._gate.drained():
            await asyncio.to_thread(weights.check_unchanged, *checked)
            await self._reload(path)
            self._gate.serve(Serving(version))

    async def _reload(self, path: str) -> None:
        """Load a verified directory into the running model, in place; on failure try to put the
        previous weights back, else mark the backend failed (503) rather than serve half a load."""
        llm, previous = self._engine.llm, self._engine.weights_path
        try:
            await self._engine.run(llm.collective_rpc("reload_weights", kwargs={"weights_path": path}))
            self._engine.weights_path = path
        except Exception as err:
            log.exception("%s: loading %s into vLLM failed; restoring %s", self.name, path, previous)
            try:
                await self._engine.run(llm.collective_rpc("reload_weights", kwargs={"weights_path": previous}))
            except Exception:
                self._failed = f"weights could not be loaded nor restored: {err}"
                log.exception("%s: restoring %s failed; backend marked failed", self.name, previous)
            raise BackendError(f"vLLM could not load {path!r}: {err}") from err
        finally:
            # KV blocks cached for the old weights must not be reused by the new ones.
            await self._engine.run(llm.reset_prefix_cache())

    async def _swap_lora(self, version: int, path: str) -> None:
        from vllm.lora.request import LoRARequest

        # A new name and id per version: vLLM keys cached prefixes and loaded adapters on them.
        request = LoRARequest(f"{self.name}-v{version}", self._engine.next_lora_id(), path)
        try:
            await self._engine.run(self._engine.llm.add_lora(request))
        except Exception as err:  # noqa: BLE001 - vLLM reports an unusable adapter in many ways
            raise WeightLoadError(f"adapter does not fit the serving model: {err}") from None
        if self._engine.weights_path != self._model_dir:
            # Adapters are relative to the initial weights; a full update replaced them.
            async with self._gate.drained():
                await self._reload(self._model_dir)
                self._gate.serve(Serving(version, request))
        else:
            self._gate.serve(Serving(version, request))  # running requests keep their adapter

    def _merge_lora(self, path: str, sha256: str) -> str:
        """For architectures vLLM has no LoRA for: the adapter merged into a full-weights directory."""
        weights.verify_adapter(path, sha256)
        merged = adapters.merged_directory(self._model_dir, path, f"corl-{self.name}-merged-")
        try:
            weights.check_spec(
                weights.files_spec(weights_store.safetensors_files(merged)), self._reference, self._aliases
            )
        except BaseException:
            shutil.rmtree(merged, ignore_errors=True)
            raise
        return merged

    # --- the weight group (GPUs only: the engine's workers hold it, see vllm_transfer) ------------
    @property
    def weight_group(self) -> str | None:
        return self._group

    def transfer_dtype(self) -> str | None:
        if not (self._engine.started and self._engine.transfer):
            return None
        return dtype_name(self._engine.llm.model_config.dtype)

    def transfer_backends(self) -> tuple[str, ...]:
        return ("nccl",) if self.transfer_dtype() is not None else ()

    async def join_weight_group(self, spec: GroupSpec) -> list[int]:
        if self.transfer_dtype() is None or spec.backend != "nccl":
            raise GroupUnsupportedError("a vLLM server joins NCCL weight groups, on GPUs only")
        await self.leave_weight_group()
        body = {**vars(spec), "rank_offset": spec.rank}
        llm = self._engine.llm
        try:
            ranks = await self._engine.run(llm.collective_rpc("corl_join_group", args=(body,)))
        except Exception as err:  # noqa: BLE001 - a worker that could not join: the group is not formed
            raise WeightGroupError(f"could not join weight group {spec.group_id}: {err}") from None
        self._group = spec.group_id
        return sorted(int(r) for r in ranks)

    async def leave_weight_group(self) -> None:
        if self._group is not None:
            self._group = None
            with contextlib.suppress(Exception):
                await self._engine.run(self._engine.llm.collective_rpc("corl_leave_group"))

    async def receive_weights(
        self, version: int, manifest: Manifest, uri: str | None, segment: SharedRef | None = None
    ) -> float:
        # ``segment`` never comes: this backend's join answers shared_memory false (its workers take
        # the group's bytes into the engine as they arrive).
        if self._group is None:
            raise WeightGroupError("this server is in no weight group")
        llm = self._engine.llm
        async with self._swap_lock:
            if self._failed:
                raise BackendError(self._failed)
            t0 = time.perf_counter()
            try:
                weights.check_newer(version, self.weight_version)
                dtypes = dict.fromkeys(self._reference, self.transfer_dtype() or "")
                weights.check_manifest(manifest, self._reference, dtypes, self._aliases)
            except (StaleVersionError, WeightLoadError):
                with contextlib.suppress(Exception):  # the workers' no, so that no rank waits for them
                    await self._engine.run(llm.collective_rpc("corl_refuse", args=(version,)))
                raise
            plain = [(name, dtype, list(shape)) for name, dtype, shape in manifest]
            async with self._gate.drained():
                try:
                    await self._engine.run(llm.collective_rpc("corl_receive", args=(version, plain)))
                except Exception as err:  # noqa: BLE001 - the workers' errors come back as text
                    await self._receive_failed(str(err))
                finally:
                    await self._engine.run(llm.reset_prefix_cache())  # no KV block of other weights reused
                self._gate.serve(Serving(version))
                if uri is not None:
                    self._engine.weights_path = uri  # where this version's files appear: a restore reads them
            seconds = time.perf_counter() - t0
            log.info("%s: took weight version %d from group %s in %.3fs", self.name, version, self._group, seconds)
            return seconds

    async def _receive_failed(self, message: str) -> None:
        """Map a worker's failure to the contract, after putting the previous version back."""
        if "refused by rank" in message:  # the agree step said no: nothing was written
            raise TransferAbortedError(message)
        if "broken" in message or "weight group" in message:
            self._group = None  # the workers left the broken group
        previous = self._engine.weights_path
        deadline = time.monotonic() + 120.0
        while not Path(previous).is_dir() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # a version taken by broadcast: its files are being written
        try:
            await self._reload(previous)
        except BackendError:
            pass  # _reload marked the backend failed (503) when even the restore failed
        if "different fingerprint" in message:
            raise WeightLoadError(message, field="tensors")
        raise WeightGroupError(message)
