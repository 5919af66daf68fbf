"""The backend interface: everything the model server needs from an inference engine.

A backend owns one model and its weights. It is async throughout: heavy work runs in the
engine's own async API (vLLM) or in a worker thread (transformers), never on the event loop.
Everything above it (dynamic batching, vote grading, checksums of the HTTP contract, metrics)
lives in the serving layer, so a new backend implements only this class.

Atomicity contract: every output carries the ``weight_version`` that produced *all* of it, and
``load_weights`` loads beside the serving weights and swaps in one step; a failed load leaves the
old weights serving. Versions only move forward. A stream (``stream``) holds one version from its
first token to its last, however many swaps land meanwhile. A backend that can take a version from
the member's weight group (``join_weight_group``, ``receive_weights``: the in-memory path, see
``corl.transfer``) keeps the same contract for it.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from corl.services.errors import ConflictError, InvalidInputError, NotFoundError, UnavailableError

if TYPE_CHECKING:
    from corl.transfer import GroupSpec
    from corl.transfer.shared import SharedRef

WeightFormat = Literal["full", "lora"]
FinishReason = Literal["stop", "length"]
#: A broadcast's manifest: (state-dict name, dtype name, shape) per tensor, in sending order.
Manifest = Sequence[tuple[str, str, tuple[int, ...]]]


@dataclass(frozen=True)
class SamplingParams:
    """Token-level sampling parameters of one request (vLLM's names). ``temperature == 0`` is greedy."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # generation ends after the token that completes one of these
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    text: str  # decoded, without the end-of-sequence token or the stop string
    token_ids: list[int]  # includes the end token (or the stop string's tokens) when finish_reason == "stop"
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    finish_reason: FinishReason


@dataclass(frozen=True)
class PromptOutput:
    prompt_token_ids: list[int]
    completions: list[Completion]  # exactly SamplingParams.n


@dataclass(frozen=True)
class GenerateOutput:
    weight_version: int  # the one version that produced every completion below
    outputs: list[PromptOutput]  # one per prompt, in order


@dataclass(frozen=True)
class TokenDelta:
    """Tokens one completion sampled since its last delta; ``index`` is ``prompt * n + choice``."""

    index: int
    token_ids: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class StreamStep:
    """The tokens sampled in one decoding step (of the completions that sampled one)."""

    weight_version: int  # the stream's one version: every step and the final output carry it
    deltas: list[TokenDelta]


#: What ``Backend.stream`` yields: a ``StreamStep`` per decoding step, then the ``GenerateOutput``.
Streamed = AsyncGenerator[StreamStep | GenerateOutput, None]


@dataclass(frozen=True)
class JudgeOutput:
    weight_version: int
    scores: list[float]  # P(correct) / (P(correct) + P(incorrect)) of the next token, per text


class BackendError(UnavailableError):
    """The engine failed (not the caller's fault): the server answers 503."""


class WeightLoadError(InvalidInputError):
    """New weights cannot be used (missing file, bad checksum, wrong tensor names/shapes): 422.

    ``field`` names the request field at fault (``uri``, ``sha256``, ``format``)."""

    default_field = "uri"


class StaleVersionError(ConflictError):
    """The offered version is not newer than the one serving: 409."""

    default_field = "version"


class TransferAbortedError(ConflictError):
    """Another rank of the weight group refused this version, so nothing was sent: 409; the serving
    weights are untouched (the trainer brings this replica up from the version's files)."""

    default_field = "version"


class GroupUnsupportedError(ConflictError):
    """This server cannot join such a weight group (its backend takes files only, or the group's backend
    is not for its device): 409. The trainer sends it files."""

    default_field = "backend"


class RendezvousNotFoundError(NotFoundError):
    """No weight group's rendezvous answers at the address the request names (404)."""

    default_field = "master_address"


class WeightGroupError(BackendError):
    """The weight group's collective failed or timed out (a peer died or hung): 503. The previous
    version serves (kept, or restored from its files), and the server has left the group."""


class Backend(abc.ABC):
    """One model behind the server. Construct cheaply; ``start`` loads the model.

    Constructors take ``(model_dir: str, name: str, initial_version: int = 0, **options)`` (see
    ``backends.create_backend``); ``model_dir`` is a save_pretrained directory with its tokenizer.
    """

    #: short engine name reported by ``/v1/info`` ("transformers", "vllm")
    kind: str = "abstract"
    #: True when the serving layer should merge concurrent requests into one ``generate`` call.
    #: Engines with their own continuous batching (vLLM) set False and take requests as they come.
    wants_batching: bool = True

    def __init__(self, model_dir: str, name: str, initial_version: int = 0) -> None:
        self.name = name  # cohort member name
        self.family = "unknown"  # config.model_type (gpt2, llama, ...), known once started
        self.parameters = 0  # parameter count of the serving model, known once started
        self.tokenizer: Any = None  # the member's Hugging Face tokenizer, loaded by ``start``
        self._model_dir = str(model_dir)
        self._initial_version = initial_version
        self._reference: dict[str, tuple[int, ...]] = {}  # tensor name -> shape of the serving model
        self._aliases: dict[str, frozenset[str]] = {}  # names that share storage (tied embeddings)

    @property
    @abc.abstractmethod
    def weight_version(self) -> int:
        """Version now serving (the initial weights are version ``initial_version``, default 0)."""

    @property
    def max_context(self) -> int | None:
        """Prompt plus new tokens the model accepts, when known."""
        return None

    def judges(self, verdicts: Sequence[str]) -> bool:
        """Whether ``judge`` can score these verdicts: each must be one token of the tokenizer."""
        tok = self.tokenizer
        return tok is None or all(len(tok.encode(v, add_special_tokens=False)) == 1 for v in verdicts)

    def too_long(self, prompts: Sequence[str], max_tokens: int) -> int | None:
        """Index of the first (rendered) prompt whose tokens plus ``max_tokens`` exceed the model's
        context, or None: the server rejects such requests as bad input (422) instead of failing in
        the engine. Cheap: called per request."""
        return first_too_long(self.tokenizer, prompts, max_tokens, self.max_context)

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; after this returns the backend serves requests."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the engine (threads, GPU memory). Idempotent."""

    @abc.abstractmethod
    async def generate(self, prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        """``params.n`` completions per prompt, all from one weight version."""

    async def stream(self, prompts: Sequence[str], params: SamplingParams) -> Streamed:
        """``generate`` as it decodes: a ``StreamStep`` per decoding step, then the ``GenerateOutput``
        that ``generate`` would return for the same seed. One weight version is leased from the first
        step to the last; closing the iterator early stops decoding. This default, for engines that
        cannot stream, generates first and yields every token in one step."""
        out = await self.generate(prompts, params)
        deltas = [
            TokenDelta(p * params.n + j, c.token_ids, c.logprobs)
            for p, o in enumerate(out.outputs)
            for j, c in enumerate(o.completions)
        ]
        yield StreamStep(out.weight_version, deltas)
        yield out

    @abc.abstractmethod
    async def judge(self, texts: Sequence[str], correct_token: str, incorrect_token: str) -> JudgeOutput:
        """Normalised probability of ``correct_token`` vs ``incorrect_token`` as the next token after
        each text, read from the logits (no sampling, no text parsing). Each verdict string must be a
        single token of the model's tokenizer, else ``ValueError``."""

    @abc.abstractmethod
    async def load_weights(self, version: int, path: str, fmt: WeightFormat, sha256: str) -> float:
        """Load ``path`` beside the serving weights, verify, swap atomically; return seconds taken.

        ``full``: a save_pretrained directory (``*.safetensors``) with the serving model's tensor
        names and shapes. ``lora``: a peft adapter directory for the *initial* base weights.
        ``sha256`` is over the bytes of every ``*.safetensors`` file in the directory in sorted
        file-name order (``corl.weights_store.digest``); verify it before swapping.
        Raises ``StaleVersionError`` if ``version <= weight_version`` and ``WeightLoadError`` for
        unusable weights; in both cases the old weights keep serving. Requests already running
        finish on the old weights. ``sha256`` may instead be ``xxh3-128:<hex>``: a digest of the
        same bytes (``corl.weights_store.checksum_files`` verifies either).
        """

    # --- the in-memory path (a backend that has it overrides all four) -------------------------------
    @property
    def weight_group(self) -> str | None:
        """Id of the weight group this backend is in (None: in none)."""
        return None

    def transfer_dtype(self) -> str | None:
        """The dtype a broadcast must send floating-point tensors in (None: this backend takes files only)."""
        return None

    def transfer_backends(self) -> tuple[str, ...]:
        """The weight groups this backend can join: ``gloo`` (CPU tensors), ``nccl`` (CUDA tensors)."""
        return ()

    def takes_shared_memory(self) -> bool:
        """Whether a version may come through the trainer's shared-memory segment (same host, CPU tensors)."""
        return False

    async def join_weight_group(self, spec: GroupSpec) -> list[int]:
        """Join the member's weight group (leaving any other); return the ranks held. Blocks until every
        rank has joined; ``WeightGroupError`` at the timeout, ``GroupUnsupportedError`` for a group this
        backend cannot be in."""
        raise GroupUnsupportedError(f"the {self.kind} backend takes weights from files only")

    async def receive_weights(
        self, version: int, manifest: Manifest, uri: str | None, segment: SharedRef | None = None
    ) -> float:
        """Take ``version`` from the weight group as it is broadcast (in manifest order), verify every
        tensor's fingerprint, flip; return seconds taken. A stale version (``StaleVersionError``) or a
        manifest that is not the serving model's (``WeightLoadError``) is refused before a byte moves;
        changed bytes raise ``WeightLoadError``, a failed collective ``WeightGroupError``, another
        rank's refusal ``TransferAbortedError``. In every case the previous version keeps serving (a
        backend that loads in place restores it from its files, ``uri`` of the broadcast before).
        ``segment``: the trainer's shared-memory copy of the version (``takes_shared_memory``)."""
        raise WeightLoadError(f"the {self.kind} backend takes weights from files only", field="backend")

    async def leave_weight_group(self) -> None:  # noqa: B027 - a files-only backend is in no group
        """Leave the weight group, if in one."""


def first_too_long(tokenizer: Any, prompts: Sequence[str], max_tokens: int, limit: int | None) -> int | None:
    """Index of the first prompt whose tokens plus ``max_tokens`` exceed ``limit``, or None; one
    batched tokenizer call (per-prompt ``encode`` costs more than a tiny model's forward pass)."""
    if limit is None or tokenizer is None:
        return None
    # No tokenizer in use (BPE, unigram, WordPiece, char-level) makes more tokens than UTF-8 bytes,
    # plus a prefix-space marker: prompts that fit by that bound need no tokenizer call.
    if all(len(p.encode()) + 1 + max_tokens <= limit for p in prompts):
        return None
    for i, ids in enumerate(tokenizer(list(prompts), add_special_tokens=False)["input_ids"]):
        if len(ids) + max_tokens > limit:
            return i
    return None


def single_token_id(tokenizer: Any, text: str, owner: str) -> int:
    """The id of ``text`` if the tokenizer makes it exactly one token (judge verdicts must be)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"verdict {text!r} is {len(ids)} tokens for {owner}'s tokenizer, not 1")
    return int(ids[0])
