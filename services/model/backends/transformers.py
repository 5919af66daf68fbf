"""The transformers backend: CPU everywhere, CUDA where present.

Model work runs in one inference thread (``corl-infer``), weight loading in another
(``corl-swap``), so a swap never stalls serving. Two model instances are kept, the serving
one and a spare: a swap loads into the spare beside the serving weights, verifies it, and
flips one reference. A batch leases the serving slot for its whole run, so it is served by one
version only, and the next swap waits for the old slot's leases to drain before reusing it. A stream
is such a run whose decode loop hands each step's tokens to the server's loop as they are sampled.
Swap cost is therefore a file read plus one ``load_state_dict`` copy (what a raw load costs),
with the checksum computed on a second thread at the same time. A LoRA adapter is merged in place
(``adapters``): the weights it targets are reset from a kept copy of their initial values and its
deltas added, so the rest of the model (the embeddings) is never re-read. A version taken from the
member's weight group (``receive_weights``) lands the same way: each broadcast tensor straight in the
spare's tensor, fingerprints checked, one flip; a transfer that fails never touched the serving copy.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence, Set
from concurrent.futures import ThreadPoolExecutor

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from corl import weights_store
from corl.models.sampling import sample
from corl.transfer import (
    GroupSpec,
    TransferError,
    TransferGroup,
    TransferRefused,
    dtype_name,
    open_store,
)
from corl.transfer.shared import SharedRef

from . import adapters, base, weights
from .relay import Relay
from .slots import Slot

log = logging.getLogger(__name__)


class TransformersBackend(base.Backend):
    kind = "transformers"
    wants_batching = True

    def __init__(
        self,
        model_dir: str,
        name: str,
        initial_version: int = 0,
        device: str = "auto",
        num_threads: int | None = None,
    ) -> None:
        super().__init__(model_dir, name, initial_version)
        self._device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self._num_threads = num_threads
        self._infer = ThreadPoolExecutor(1, thread_name_prefix="corl-infer")
        self._swap = ThreadPoolExecutor(2, thread_name_prefix="corl-swap")
        self._cond = threading.Condition()
        self._active: Slot | None = None
        self._spare: Slot | None = None
        self._swap_lock = asyncio.Lock()
        self._max_len: int | None = None
        self._takes_positions = False
        self._keeps_last_logits = False
        self._initial: dict[str, torch.Tensor] = {}  # initial values of the weights adapters target
        self._dtypes: dict[str, str] = {}  # tensor name -> dtype of the serving model
        self._float_dtype: str | None = None
        self._group: TransferGroup | None = None

    @property
    def weight_version(self) -> int:
        return self._active.version if self._active else self._initial_version

    @property
    def max_context(self) -> int | None:
        return self._max_len

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._infer, self._start_sync)

    def _start_sync(self) -> None:
        if self._num_threads:
            torch.set_num_threads(self._num_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(self._model_dir)
        if self.tokenizer.pad_token_id is None:  # most hub tokenizers: pad with the end token
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # batched generation continues every prompt from its last token
        model = AutoModelForCausalLM.from_pretrained(self._model_dir).to(self._device).eval()  # type: ignore[arg-type]
        self.family = str(model.config.model_type)
        self.parameters = sum(p.numel() for p in model.parameters())
        self._max_len = getattr(model.config, "n_positions", None) or getattr(
            model.config, "max_position_embeddings", None
        )
        sd = model.state_dict()
        self._reference = {k: tuple(v.shape) for k, v in sd.items()}
        self._dtypes = {k: dtype_name(v.dtype) for k, v in sd.items()}
        self._float_dtype = next((dtype_name(p.dtype) for p in model.parameters() if p.is_floating_point()), None)
        # Tied tensors (e.g. lm_head / embeddings) are saved once; any one name of a group suffices.
        by_ptr: dict[int, set[str]] = {}
        for k, v in sd.items():
            by_ptr.setdefault(v.data_ptr(), set()).add(k)
        self._aliases = {k: frozenset(group) for group in by_ptr.values() for k in group}
        self._takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        self._keeps_last_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._stored_in_out = adapters.transposed_weights(model)
        # Both slots own their memory: on CPU, from_pretrained's tensors may be pages of the mapped
        # checkpoint, and the first write into such a page (the first swap into that slot) copies it:
        # 4 s for Qwen2.5-0.5B's LoRA-targeted weights, against 0.3 s for a merge into owned memory.
        self._active = Slot(copy.deepcopy(model) if self._device == "cpu" else model, self._initial_version)
        self._spare = Slot(copy.deepcopy(model), -1)
        log.info("loaded %s (%s, %d parameters) on %s", self.name, self.family, self.parameters, self._device)

    async def close(self) -> None:
        await self.leave_weight_group()
        self._infer.shutdown(wait=False, cancel_futures=True)
        self._swap.shutdown(wait=False, cancel_futures=True)

    # --- leases -------------------------------------------------------------------------------
    def _lease(self) -> Slot:
        with self._cond:
            if self._active is None:
                raise base.BackendError("model not loaded")
            slot = self._active
            slot.leases += 1
            return slot

    def _release(self, slot: Slot) -> None:
        with self._cond:
            slot.leases -= 1
            self._cond.notify_all()

    # --- inference ----------------------------------------------------------------------------
    async def generate(self, prompts: Sequence[str], params: base.SamplingParams) -> base.GenerateOutput:
        return await asyncio.get_running_loop().run_in_executor(self._infer, self._generate_sync, list(prompts), params)

    async def stream(self, prompts: Sequence[str], params: base.SamplingParams) -> base.Streamed:
        relay: Relay[base.StreamStep] = Relay()
        job = asyncio.get_running_loop().run_in_executor(
            self._infer, self._generate_sync, list(prompts), params, relay.push
        )
        async for item in relay.items(job):
            yield item

    def _generate_sync(
        self, prompts: list[str], params: base.SamplingParams, on_step: Callable[[base.StreamStep], None] | None = None
    ) -> base.GenerateOutput:
        # Greedy samples are identical: decode once, repeat (HF refuses greedy num_return_sequences > 1).
        greedy = params.temperature == 0
        copies = params.n if greedy else 1
        slot = self._lease()

        def step(sampled: list[tuple[int, int, float]]) -> None:
            assert on_step is not None
            deltas = [base.TokenDelta(r * copies + k, [t], [lp]) for r, t, lp in sampled for k in range(copies)]
            on_step(base.StreamStep(slot.version, deltas))

        try:
            results = sample(
                slot.model,
                self.tokenizer,
                prompts,
                n=1 if greedy else params.n,
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                stop=params.stop,
                seed=params.seed,
                on_step=None if on_step is None else step,
            )
        finally:
            self._release(slot)
        outputs = [
            base.PromptOutput(
                r.prompt_token_ids,
                [
                    base.Completion(c.text, c.token_ids, c.logprobs, c.finish_reason)  # type: ignore[arg-type]
                    for c in (r.completions * params.n if greedy else r.completions)
                ],
            )
            for r in results
        ]
        return base.GenerateOutput(slot.version, outputs)

    async def judge(self, texts: Sequence[str], correct_token: str, incorrect_token: str) -> base.JudgeOutput:
        ids = [self._single_token(t) for t in (correct_token, incorrect_token)]
        return await asyncio.get_running_loop().run_in_executor(self._infer, self._judge_sync, list(texts), ids)

    def _single_token(self, text: str) -> int:
        return base.single_token_id(self.tokenizer, text, self.name)

    @torch.inference_mode()
    def _judge_sync(self, texts: list[str], ids: list[int]) -> base.JudgeOutput:
        slot = self._lease()
        try:
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self._device)
            inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
            if self._takes_positions:  # left padding: positions count real tokens only
                inputs["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            if self._keeps_last_logits:  # a judge reads the next-token logits only: B x V, never B x T x V
                inputs["logits_to_keep"] = 1
            logits = slot.model(**inputs).logits[:, -1, :].float()  # left padding: last column is next-token
        finally:
            self._release(slot)
        # P(c) / (P(c) + P(i)) = sigmoid(logit_c - logit_i): the softmax normaliser cancels.
        scores = torch.sigmoid(logits[:, ids[0]] - logits[:, ids[1]]).tolist()
        return base.JudgeOutput(slot.version, scores)

    # --- weights ---------------------------------------------------------------------------
    async def load_weights(self, version: int, path: str, fmt: base.WeightFormat, sha256: str) -> float:
        async with self._swap_lock:
            weights.check_newer(version, self.weight_version)
            return await asyncio.get_running_loop().run_in_executor(
                self._swap, self._load_sync, version, path, fmt, sha256
            )

    def _load_sync(self, version: int, path: str, fmt: base.WeightFormat, sha256: str) -> float:
        t0 = time.perf_counter()
        assert self._spare is not None and self._active is not None
        with self._cond:  # the spare was serving before the last swap: let its batches finish
            self._cond.wait_for(lambda: self._spare is not None and self._spare.leases == 0)
        spare = self._spare
        try:
            model = self._load_full(spare, path, sha256) if fmt == "full" else self._load_lora(spare, path, sha256)
        except BaseException:
            # The spare may be half-written: rebuild it from the serving model.
            self._spare = Slot(copy.deepcopy(self._active.model), -1, merged=self._active.merged)
            raise
        with self._cond:
            spare.model, spare.version = model, version
            self._spare, self._active = self._active, spare
        seconds = time.perf_counter() - t0
        log.info("%s: swapped to weight version %d (%s) in %.3fs", self.name, version, fmt, seconds)
        return seconds

    @torch.no_grad()
    def _load_full(self, slot: Slot, path: str, sha256: str) -> PreTrainedModel:
        weights.load_verified(path, sha256, self._reference, self._aliases, slot.copy_in, self._swap)
        slot.merged = frozenset(slot.targets)  # none is the initial value now (a later adapter resets all)
        return slot.model

    @torch.no_grad()
    def _load_lora(self, slot: Slot, path: str, sha256: str) -> PreTrainedModel:
        weights.verify_adapter(path, sha256)
        deltas = adapters.read_adapter(path, self._reference, self._stored_in_out)
        slot.own()
        initial = self._initial_values(deltas.keys() | slot.merged, slot.targets)
        # Adapters are relative to the initial weights: what the last one changed is reset first.
        for name in slot.merged - deltas.keys():
            slot.targets[name].copy_(initial[name])
        for name, delta in deltas.items():
            delta.merge_into(slot.targets[name], initial[name])
        slot.merged = frozenset(deltas)
        return slot.model

    def _initial_values(self, names: Set[str], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model directory's values of ``names``, read once and kept (in memory, the weights an
        adapter targets: resetting them is then a copy, not a read of the whole checkpoint)."""
        # Tied weights are saved under one name of their group: any of them will do.
        wanted = {k: n for n in names - self._initial.keys() for k in self._aliases.get(n, frozenset({n}))}
        for f in weights_store.safetensors_files(self._model_dir) if wanted else ():
            with safe_open(f, framework="pt") as st:
                for key in wanted.keys() & set(st.keys()):
                    name = wanted[key]
                    self._initial[name] = st.get_tensor(key).to(like[name].device, like[name].dtype).clone()
        lost = sorted(names - self._initial.keys())
        if lost:
            raise base.WeightLoadError(f"not in the model directory's weights: {lost}")
        return {n: self._initial[n] for n in names}

    # --- the weight group (the in-memory path) ---------------------------------------------------
    @property
    def weight_group(self) -> str | None:
        return self._group.group_id if self._group else None

    def transfer_dtype(self) -> str | None:
        return self._float_dtype

    def transfer_backends(self) -> tuple[str, ...]:
        return ("nccl",) if self._device.startswith("cuda") else ("gloo",)

    async def join_weight_group(self, spec: GroupSpec) -> list[int]:
        if (spec.backend == "nccl") != self._device.startswith("cuda"):
            raise base.GroupUnsupportedError(f"a server on {self._device} cannot join a {spec.backend} group")
        await self.leave_weight_group()

        def join() -> TransferGroup:
            return TransferGroup.join(spec, open_store(spec, master=False), torch.device(self._device))

        try:
            self._group = await asyncio.to_thread(join)
        except (TransferError, RuntimeError, ValueError, OSError) as err:  # gloo and the store say RuntimeError
            raise base.WeightGroupError(f"could not join weight group {spec.group_id}: {err}") from None
        return [spec.rank]

    async def leave_weight_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            await asyncio.to_thread(group.close)

    def takes_shared_memory(self) -> bool:
        return self._device == "cpu"

    async def receive_weights(
        self, version: int, manifest: base.Manifest, uri: str | None, segment: SharedRef | None = None
    ) -> float:
        group = self._group
        if group is None:
            raise base.WeightGroupError("this server is in no weight group")
        async with self._swap_lock:
            try:
                weights.check_newer(version, self.weight_version)
                weights.check_manifest(manifest, self._reference, self._dtypes, self._aliases)
            except (base.StaleVersionError, base.WeightLoadError):
                await asyncio.to_thread(self._refuse, group, version)
                raise
            return await asyncio.get_running_loop().run_in_executor(
                self._swap, self._receive_sync, group, version, manifest, segment
            )

    def _refuse(self, group: TransferGroup, version: int) -> None:
        """Say no in the group's agree step, so that no rank waits for this one (its error is the answer)."""
        try:
            group.refuse(version)
        except TransferRefused:
            pass
        except TransferError:
            self._drop(group)

    def _holding(self) -> set[str]:
        """The trainer's segments whose pages this server's weights are (either slot's)."""
        return {s.segment for s in (self._active, self._spare) if s is not None and s.segment is not None}

    def _drop(self, group: TransferGroup) -> None:
        group.close()
        if self._group is group:
            self._group = None

    @torch.no_grad()
    def _receive_sync(
        self, group: TransferGroup, version: int, manifest: base.Manifest, segment: SharedRef | None
    ) -> float:
        t0 = time.perf_counter()
        assert self._active is not None
        with self._cond:  # the spare was serving before the last swap: let its batches finish
            self._cond.wait_for(lambda: self._spare is not None and self._spare.leases == 0)
        spare = self._spare
        assert spare is not None
        try:
            spare.receive(group, version, manifest, segment, self._holding)
        except base.WeightGroupError:
            self._drop(group)
            raise
        with self._cond:
            self._spare, self._active = self._active, spare
        seconds = time.perf_counter() - t0
        log.info("%s: took weight version %d from group %s in %.3fs", self.name, version, group.group_id, seconds)
        return seconds
