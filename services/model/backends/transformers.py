"""The transformers backend: CPU everywhere, CUDA where present.

Model work runs in one inference thread (``corl-infer``), weight loading in another
(``corl-swap``), so a swap never stalls serving. Two model instances are kept, the serving
one and a spare: a swap loads into the spare beside the serving weights, verifies it, and
flips one reference. A batch leases the serving slot for its whole run, so it is served by one
version only, and the next swap waits for the old slot's leases to drain before reusing it.
Swap cost is therefore a file read plus one ``load_state_dict`` copy (what a raw load costs),
with the checksum computed on a second thread at the same time.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from corl import weights_store
from corl.models.sampling import sample

from . import base, weights
from .base import GenerateOutput, JudgeOutput, SamplingParams, WeightFormat, WeightLoadError

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    model: PreTrainedModel
    version: int
    leases: int = 0
    targets: dict[str, torch.Tensor] = field(init=False, repr=False)  # state-dict name -> live tensor

    def __post_init__(self) -> None:
        self.targets = dict(self.model.state_dict())


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
        self._active: _Slot | None = None
        self._spare: _Slot | None = None
        self._swap_lock = asyncio.Lock()
        self._max_len: int | None = None
        self._takes_positions = False

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
        # Tied tensors (e.g. lm_head / embeddings) are saved once; any one name of a group suffices.
        by_ptr: dict[int, set[str]] = {}
        for k, v in sd.items():
            by_ptr.setdefault(v.data_ptr(), set()).add(k)
        self._aliases = {k: frozenset(group) for group in by_ptr.values() for k in group}
        self._takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        self._active = _Slot(model, self._initial_version)
        self._spare = _Slot(copy.deepcopy(model), -1)
        log.info("loaded %s (%s, %d parameters) on %s", self.name, self.family, self.parameters, self._device)

    async def close(self) -> None:
        self._infer.shutdown(wait=False, cancel_futures=True)
        self._swap.shutdown(wait=False, cancel_futures=True)

    # --- leases -------------------------------------------------------------------------------
    def _lease(self) -> _Slot:
        with self._cond:
            if self._active is None:
                raise base.BackendError("model not loaded")
            slot = self._active
            slot.leases += 1
            return slot

    def _release(self, slot: _Slot) -> None:
        with self._cond:
            slot.leases -= 1
            self._cond.notify_all()

    # --- inference ----------------------------------------------------------------------------
    async def generate(self, prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        return await asyncio.get_running_loop().run_in_executor(self._infer, self._generate_sync, list(prompts), params)

    def _generate_sync(self, prompts: list[str], params: SamplingParams) -> GenerateOutput:
        # Greedy samples are identical: decode once, repeat (HF refuses greedy num_return_sequences > 1).
        greedy = params.temperature == 0
        slot = self._lease()
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
        return GenerateOutput(slot.version, outputs)

    async def judge(self, texts: Sequence[str], correct_token: str, incorrect_token: str) -> JudgeOutput:
        ids = [self._single_token(t) for t in (correct_token, incorrect_token)]
        return await asyncio.get_running_loop().run_in_executor(self._infer, self._judge_sync, list(texts), ids)

    def _single_token(self, text: str) -> int:
        return base.single_token_id(self.tokenizer, text, self.name)

    @torch.inference_mode()
    def _judge_sync(self, texts: list[str], ids: list[int]) -> JudgeOutput:
        slot = self._lease()
        try:
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self._device)
            inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
            if self._takes_positions:  # left padding: positions count real tokens only
                inputs["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            logits = slot.model(**inputs).logits[:, -1, :].float()  # left padding: last column is next-token
        finally:
            self._release(slot)
        # P(c) / (P(c) + P(i)) = sigmoid(logit_c - logit_i): the softmax normaliser cancels.
        scores = torch.sigmoid(logits[:, ids[0]] - logits[:, ids[1]]).tolist()
        return JudgeOutput(slot.version, scores)

    # --- weights ---------------------------------------------------------------------------
    async def load_weights(self, version: int, path: str, fmt: WeightFormat, sha256: str) -> float:
        async with self._swap_lock:
            weights.check_newer(version, self.weight_version)
            return await asyncio.get_running_loop().run_in_executor(
                self._swap, self._load_sync, version, path, fmt, sha256
            )

    def _load_sync(self, version: int, path: str, fmt: WeightFormat, sha256: str) -> float:
        t0 = time.perf_counter()
        assert self._spare is not None and self._active is not None
        with self._cond:  # the spare was serving before the last swap: let its batches finish
            self._cond.wait_for(lambda: self._spare is not None and self._spare.leases == 0)
        spare = self._spare
        try:
            model = self._load_full(spare, path, sha256) if fmt == "full" else self._load_lora(spare, path, sha256)
        except BaseException:
            # The spare may be half-written (or wrapped by peft): rebuild it from the serving model.
            self._spare = _Slot(copy.deepcopy(self._active.model), -1)
            raise
        with self._cond:
            new = spare if model is spare.model else _Slot(model, version)
            new.version = version
            self._spare, self._active = self._active, new
        seconds = time.perf_counter() - t0
        log.info("%s: swapped to weight version %d (%s) in %.3fs", self.name, version, fmt, seconds)
        return seconds

    @staticmethod
    def _parse(files: list[Path]) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                tensors.update(load_file(f))
            except Exception as err:  # noqa: BLE001 - any parse failure is a bad file
                raise WeightLoadError(f"{f.name} is not a readable safetensors file: {err}") from None
        return tensors

    @torch.no_grad()
    def _load_full(self, slot: _Slot, path: str, sha256: str) -> PreTrainedModel:
        def load(files: list[Path]) -> None:
            # Copy straight into the spare's tensors: load_state_dict's module walk costs more than the copy.
            for name, tensor in self._parse(files).items():
                slot.targets[name].copy_(tensor)

        weights.load_verified(path, sha256, self._reference, self._aliases, load, self._swap)
        return slot.model

    @torch.no_grad()
    def _load_lora(self, slot: _Slot, path: str, sha256: str) -> PreTrainedModel:
        from peft import PeftModel

        weights.verify_adapter(path, sha256)
        # Adapters are relative to the initial weights: reset the spare to them, then merge.
        for name, tensor in self._parse(weights_store.safetensors_files(self._model_dir)).items():
            slot.targets[name].copy_(tensor)
        try:
            merged = PeftModel.from_pretrained(slot.model, path).merge_and_unload()
        except Exception as err:  # noqa: BLE001 - peft raises many types for a mismatched adapter
            raise WeightLoadError(f"adapter does not fit the serving model: {err}") from None
        return merged.eval()  # type: ignore[no-any-return]
