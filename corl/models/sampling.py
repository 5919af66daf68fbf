"""Batched sampling from a transformers causal LM with the log-probability of every sampled token.

The log-probs are taken from the *processed* scores (after temperature and top-p), normalised, so
they are the sampling distribution's: what a trainer needs for its off-policy importance ratio.
Temperature and top-p are this module's own logits processors (top-p without a full-vocabulary sort:
``corl.models.nucleus``, shared with the trainer), and the sampled tokens' log-probs are recorded
step by step, so no (rows, vocab) score tensor outlives its step. ``on_step`` sees each step's
tokens as they are sampled (streaming); it reads, never changes, what is sampled.
This runs synchronously; callers on an event loop run it in a worker thread.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache, DynamicLayer

from .nucleus import outside_nucleus


class _DropUnmaskedPaddingWarning(logging.Filter):
    """transformers' GPT-2 warns once, from inside ``generate``'s decode steps, that padding may be
    unmasked. It is masked: ``tests/unit/test_losses_logps.py`` checks left-padded sampling
    log-probs against the trainer's own forward pass. The warning would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "passing in an `attention_mask`" not in record.getMessage()


logging.getLogger("transformers.modeling_utils").addFilter(_DropUnmaskedPaddingWarning())

#: ``on_step`` of ``sample``: (row, token id, log-prob) of every row that sampled a token this step,
#: the token that ends a row included; row ``p * n + j`` is prompt ``p``'s ``j``-th completion.
StepSink = Callable[[list[tuple[int, int, float]]], None]


class _Sampling(LogitsProcessor):
    """Temperature, then the top-p nucleus (tokens outside it get -inf)."""

    def __init__(self, temperature: float, top_p: float) -> None:
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.temperature != 1.0:
            scores = scores / self.temperature  # type: ignore[assignment]
        if self.top_p < 1.0:
            scores = scores.masked_fill(outside_nucleus(scores, self.top_p), -float("inf"))  # type: ignore[assignment]
        return scores


class _TokenLogProbs(LogitsProcessor):
    """Last processor: keeps this step's normalised scores until the next step shows which token was
    drawn from them, and records that token's log-prob; ``finish`` adds the last step's."""

    def __init__(self, on_step: Callable[[list[int], list[float]], None] | None = None) -> None:
        self.steps: list[torch.Tensor] = []
        self._logp: torch.Tensor | None = None
        self._on_step = on_step

    def _take(self, tokens: torch.Tensor) -> None:
        if self._logp is not None:
            self.steps.append(self._logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
            if self._on_step is not None:
                self._on_step(tokens.tolist(), self.steps[-1].tolist())

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])
        self._logp = scores.float().log_softmax(-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(rows, steps) log-probs of ``new_tokens``, the tokens generated."""
        self._take(new_tokens[:, -1])
        self._logp = None
        return torch.stack(self.steps, dim=1)


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


@dataclass(frozen=True)
class PromptCompletions:
    prompt_token_ids: list[int]
    completions: list[Completion]


@torch.inference_mode()
def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    n: int = 1,
    max_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop: Sequence[str] = (),
    seed: int | None = None,
    on_step: StepSink | None = None,
) -> list[PromptCompletions]:
    """Sample ``n`` completions for each prompt. ``temperature == 0`` is greedy.

    A completion ends at the model's end token(s) (the tokenizer's and the generation config's,
    e.g. a chat model's end-of-turn) or after the token that completes a ``stop`` string; its
    text then excludes the end token or stop string, its token ids and log-probs include them.

    Models with a key/value cache (every attention family) decode in this module's own loop: each
    prompt is prefilled once, not ``n`` times, and a row that has ended leaves the batch, so a
    round costs what its live rows cost. Other caches (a state-space model's) go through
    ``model.generate``, which decodes every row to the longest (``on_step`` then hears of a step's
    tokens when the next step starts, and of the last one when decoding ends)."""
    if seed is not None:
        torch.manual_seed(seed)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    device = next(model.parameters()).device
    input_ids = enc["input_ids"].to(device)
    attention_mask = enc["attention_mask"].to(device)
    eos = end_token_ids(model, tokenizer)
    cache = DynamicCache(config=model.config)
    how = _Decoding(n, max_tokens, temperature, top_p, stop, eos, on_step)
    if all(isinstance(layer, DynamicLayer) for layer in cache.layers):
        rows = _decode(model, tokenizer, input_ids, attention_mask, cache, how)
    else:
        rows = _generate(model, tokenizer, input_ids, attention_mask, how)

    results: list[PromptCompletions] = []
    for p in range(len(prompts)):
        prompt_ids = input_ids[p][attention_mask[p].bool()].tolist()
        completions = []
        for ids, lps in rows[p * n : (p + 1) * n]:
            finish = "length"
            end = next((i for i, t in enumerate(ids) if t in eos), None)
            if end is not None:
                ids, lps, finish = ids[: end + 1], lps[: end + 1], "stop"
            text = str(tokenizer.decode(ids, skip_special_tokens=True))
            cut = stop_cut(tokenizer, ids, stop) if stop else None
            if cut is not None:
                k, text = cut
                ids, lps, finish = ids[:k], lps[:k], "stop"
            completions.append(Completion(text, ids, lps, finish))
        results.append(PromptCompletions(prompt_ids, completions))
    return results


_Rows = list[tuple[list[int], list[float]]]  # per completion row: sampled token ids, their log-probs


@dataclass(frozen=True)
class _Decoding:
    """What one ``sample`` call asks of either decoder: ``n`` rows per prompt of at most ``max_tokens``,
    drawn at ``temperature`` and ``top_p`` (0: greedy), each ending at an ``eos`` id or a ``stop`` string."""

    n: int
    max_tokens: int
    temperature: float
    top_p: float
    stop: Sequence[str]
    eos: list[int]
    on_step: StepSink | None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sampling(self) -> _Sampling | None:
        """The logits processor of the sampling distribution (None: greedy takes the raw argmax)."""
        return None if self.greedy else _Sampling(self.temperature, self.top_p)


def _forward(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """Next-token logits (rows, vocab) for ``ids`` appended to ``cache``; left padding: positions
    count the real tokens of each row."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
    kwargs = {cache_argument(model): cache, "use_cache": True, "logits_to_keep": 1}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs)
    return out.logits[:, -1, :]


def cache_argument(model: PreTrainedModel) -> str:
    """The name the model's ``forward`` takes its key/value cache by: ``cache`` since transformers 5,
    ``past_key_values`` before (the vLLM environment's transformers). A wrong name vanishes into
    ``**kwargs`` and every step would then see only its one new token."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _decode(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    cache: DynamicCache,
    how: _Decoding,
) -> _Rows:
    n, stop = how.n, how.stop
    shape = how.sampling()
    logits = _forward(model, input_ids, mask, cache)  # one prefill per prompt, then n rows each
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits, mask = logits.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    rows: _Rows = [([], []) for _ in range(logits.shape[0])]
    live = list(range(len(rows)))  # rows still decoding, in batch order
    end_ids = torch.tensor(how.eos, device=logits.device)
    window = _stop_window(stop)
    for step in range(how.max_tokens):
        scores = logits.float() if shape is None else shape(None, logits.float())  # type: ignore[arg-type]
        logp = scores.log_softmax(-1)
        tokens = scores.argmax(-1) if how.greedy else torch.multinomial(logp.exp(), 1).squeeze(-1)
        token_logps = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        ended = torch.isin(tokens, end_ids).tolist()
        sampled = list(zip(live, tokens.tolist(), token_logps.tolist(), strict=True))
        for j, (r, t, lp) in enumerate(sampled):
            ids, lps = rows[r]
            ids.append(t)
            lps.append(lp)
            if stop and not ended[j]:
                ended[j] = _ends_in_stop(tokenizer, ids, stop, window)
        if how.on_step is not None:
            how.on_step(sampled)
        keep = [j for j, e in enumerate(ended) if not e]
        if not keep or step == how.max_tokens - 1:
            break
        if len(keep) < len(live):  # ended rows leave the batch (and the cache)
            index = torch.tensor(keep, device=logits.device)
            cache.batch_select_indices(index)
            mask, tokens = mask[index], tokens[index]
            live = [live[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        logits = _forward(model, tokens.unsqueeze(-1), mask, cache)
    return rows


def _generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    how: _Decoding,
) -> _Rows:
    """``model.generate`` with this module's sampling distribution and log-prob recording; rows run
    to the longest (ended rows are padded, and trimmed by the caller)."""
    greedy, stop, eos = how.greedy, how.stop, how.eos
    rows = input_ids.shape[0] * how.n
    live = None if how.on_step is None else _LiveRows(how.on_step, tokenizer, stop, eos, rows)
    recorder = _TokenLogProbs(live)
    shape = how.sampling()
    processors = [] if shape is None else [shape]
    gen_kwargs: dict = dict(
        max_new_tokens=how.max_tokens,
        do_sample=not greedy,
        num_return_sequences=how.n,
        logits_processor=LogitsProcessorList([*processors, recorder]),
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
        eos_token_id=eos,
    )
    if stop:
        gen_kwargs.update(stop_strings=producible_stop_strings(tokenizer, stop), tokenizer=tokenizer)
        if not gen_kwargs["stop_strings"]:
            del gen_kwargs["stop_strings"], gen_kwargs["tokenizer"]
    # No warpers of transformers' own (nor the model's generation-config defaults): _Sampling is the
    # whole sampling distribution, so the recorded log-probs are exactly its.
    if greedy:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    else:
        gen_kwargs.update(temperature=1.0, top_p=1.0, top_k=0, min_p=None, typical_p=1.0)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **gen_kwargs)  # type: ignore[operator]
    new_tokens = out.sequences[:, input_ids.shape[1] :]
    token_logprobs = recorder.finish(new_tokens)
    return list(zip(new_tokens.tolist(), token_logprobs.tolist(), strict=True))


def _stop_window(stop: Sequence[str]) -> int:
    """Tokens enough to hold a stop string just completed."""
    return max((len(s) for s in stop), default=0) + 2


def _ends_in_stop(tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: Sequence[str], window: int) -> bool:
    """Whether the last ``window`` tokens of ``ids`` hold a stop string."""
    tail = str(tokenizer.decode(ids[-window:], skip_special_tokens=True))
    return any(s in tail for s in stop)


class _LiveRows:
    """``model.generate`` decodes ended rows on as padding: this passes each step's tokens of the
    rows still decoding (the token that ends a row included) to ``on_step``, as ``_decode`` does."""

    def __init__(
        self, on_step: StepSink, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str], eos: list[int], rows: int
    ) -> None:
        self._on_step, self._tokenizer, self._stop, self._eos = on_step, tokenizer, stop, set(eos)
        self._window = _stop_window(stop)
        self._ids: list[list[int]] = [[] for _ in range(rows)]
        self._live = [True] * rows

    def __call__(self, tokens: list[int], logprobs: list[float]) -> None:
        sampled = []
        for r, (t, lp) in enumerate(zip(tokens, logprobs, strict=True)):
            if not self._live[r]:
                continue
            ids = self._ids[r]
            ids.append(t)
            sampled.append((r, t, lp))
            ended = t in self._eos or (
                bool(self._stop) and _ends_in_stop(self._tokenizer, ids, self._stop, self._window)
            )
            self._live[r] = not ended
        if sampled:
            self._on_step(sampled)


def end_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end a completion: the generation config's (a chat model's end of turn) and the
    tokenizer's EOS, generation config first."""
    found: list[int] = []
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for i in [*(config_eos if isinstance(config_eos, list) else [config_eos]), tokenizer.eos_token_id]:
        if i is not None and int(i) not in found:
            found.append(int(i))
    if not found:
        raise ValueError("the model has no end token: set eos_token_id in its generation config or tokenizer")
    return found


def producible_stop_strings(tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]) -> list[str]:
    """The stop strings some token sequence can produce. transformers refuses to stop on a string
    with a character no token has; such a string never occurs in the output, so it is left out (and
    ``stop_cut`` still ends completions at the others)."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    try:
        StopStringCriteria(tokenizer, list(stop))  # the common case: all of them, one check (cached)
        return list(stop)
    except ValueError:
        pass
    ok = []
    for s in stop:
        try:
            StopStringCriteria(tokenizer, [s])
            ok.append(s)
        except ValueError:
            continue
    return ok


def stop_cut(tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: Sequence[str]) -> tuple[int, str] | None:
    """(tokens to keep, text before the stop string) when a stop string occurs in the decoded
    ``ids``: the fewest leading tokens whose text holds one (binary search: a prefix that holds
    one keeps holding it), so the token that completes it is the last one kept."""

    def text_of(k: int) -> str:
        return str(tokenizer.decode(ids[:k], skip_special_tokens=True))

    def first_hit(text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]
        return min(hits) if hits else None

    if first_hit(text_of(len(ids))) is None:
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_hit(text_of(mid)) is None:
            lo = mid + 1
        else:
            hi = mid
    text = text_of(lo)
    pos = first_hit(text)
    assert pos is not None
    return lo, text[:pos]
