"""vLLM and transformers serve the same weights the same way.

Tiny-cohort members (built from ``corl.cohort.presets.TINY``, weights initialised with a wide
range so that greedy choices are clear-cut rather than float ties) give the same greedy tokens and
log-probs from both backends, before and after a LoRA swap; sampled tokens' log-probs are those
of the processed (temperature, top-p) distribution, as the trainer's off-policy correction needs.
Both stream: each step's tokens as decoded, then what ``generate`` returns for the same request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corl.services.model.backends.base import Backend, GenerateOutput, SamplingParams, StreamStep

pytestmark = pytest.mark.vllm

PROMPTS = ["12+34=", "07+08=", "99+01=", "45+45=", "30+60=", "88+11="]
GREEDY = SamplingParams(n=1, max_tokens=10, temperature=0.0)


def _build_member(family: str, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from corl.cohort.presets import get_preset
    from corl.models.tokenizer import build_char_tokenizer

    (spec,) = [m for m in get_preset("tiny").members if m.family == family]
    tok = build_char_tokenizer()
    cfg = spec.build_config(tok)
    cfg.initializer_range = 0.5
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def member_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_member(request.param, tmp_path_factory.mktemp(f"member-{request.param}"))


@pytest.fixture
async def backends(member_dir: Path, vllm_engines: Callable[[Path], Any]) -> Any:
    """(vLLM, transformers) backends over the same member directory."""
    from corl.services.model.backends.transformers import TransformersBackend
    from corl.services.model.backends.vllm import VLLMBackend

    engine = vllm_engines(member_dir)
    pair = (VLLMBackend(str(member_dir), "m", engine=engine), TransformersBackend(str(member_dir), "m", num_threads=1))
    for b in pair:
        await b.start()
    yield pair
    for b in pair:
        await b.close()


def _tokens(out: GenerateOutput) -> list[list[int]]:
    return [c.token_ids for o in out.outputs for c in o.completions]


def _logprobs(out: GenerateOutput) -> list[float]:
    return [lp for o in out.outputs for c in o.completions for lp in c.logprobs]


async def _assert_same_greedy(vllm: Backend, hf: Backend) -> list[list[int]]:
    a, b = await vllm.generate(PROMPTS, GREEDY), await hf.generate(PROMPTS, GREEDY)
    assert _tokens(a) == _tokens(b)
    assert [o.prompt_token_ids for o in a.outputs] == [o.prompt_token_ids for o in b.outputs]
    assert [c.text for o in a.outputs for c in o.completions] == [c.text for o in b.outputs for c in o.completions]
    assert _logprobs(a) == pytest.approx(_logprobs(b), abs=2e-3)
    return _tokens(a)


async def test_same_greedy_tokens_as_transformers(backends: tuple[Backend, Backend]) -> None:
    await _assert_same_greedy(*backends)


async def test_same_greedy_tokens_after_lora_swap(
    backends: tuple[Backend, Backend], member_dir: Path, tmp_path: Path
) -> None:
    """A LoRA adapter (vLLM: served natively under a per-version name) changes outputs identically."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from corl.weights_store import digest

    before = await _assert_same_greedy(*backends)
    torch.manual_seed(1)
    lora = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(member_dir), lora).save_pretrained(str(tmp_path / "adapter"))
    sha = digest(tmp_path / "adapter")
    for b in backends:
        await b.load_weights(1, str(tmp_path / "adapter"), "lora", sha)
    vllm, _ = backends
    assert vllm._gate.serving.lora is not None and vllm._gate.serving.lora.lora_name == "m-v1"  # type: ignore[attr-defined]
    after = await _assert_same_greedy(*backends)
    assert after != before


async def test_sampled_logprobs_are_the_processed_distribution(
    backends: tuple[Backend, Backend], member_dir: Path
) -> None:
    """Each sampled token's log-prob is log softmax(top_p(logits / T)) at its position: the
    distribution it was drawn from, not the raw model distribution."""
    import torch
    from transformers import AutoModelForCausalLM, TopPLogitsWarper

    vllm, _ = backends
    temperature, top_p = 2.0, 0.9
    out = await vllm.generate(
        PROMPTS[:3], SamplingParams(n=4, max_tokens=6, temperature=temperature, top_p=top_p, seed=3)
    )
    model = AutoModelForCausalLM.from_pretrained(member_dir).eval()
    warp = TopPLogitsWarper(top_p)
    raw_differs = False
    for o in out.outputs:
        for c in o.completions:
            ids = torch.tensor([o.prompt_token_ids + c.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(o.prompt_token_ids) - 1 : -1].float()
            targets = torch.tensor(c.token_ids)
            processed = warp(ids, logits / temperature).log_softmax(-1).gather(-1, targets[:, None])[:, 0]
            raw = logits.log_softmax(-1).gather(-1, targets[:, None])[:, 0]
            assert c.logprobs == pytest.approx(processed.tolist(), abs=2e-3)
            raw_differs |= not torch.allclose(raw, processed, atol=1e-2)
    assert raw_differs


async def _streamed(backend: Backend, params: SamplingParams) -> tuple[list[StreamStep], GenerateOutput]:
    steps, final = [], None
    async for item in backend.stream(PROMPTS[:2], params):
        if isinstance(item, StreamStep):
            steps.append(item)
        else:
            final = item
    assert final is not None
    return steps, final


@pytest.mark.parametrize(
    "params",
    [SamplingParams(n=3, max_tokens=24, temperature=0.0), SamplingParams(n=3, max_tokens=24, temperature=1.0, seed=5)],
    ids=["greedy", "seeded"],
)
async def test_streams_send_each_step_and_end_with_the_generate_output(
    backends: tuple[Backend, Backend], params: SamplingParams
) -> None:
    vllm, hf = backends
    for backend in backends:
        steps, final = await _streamed(backend, params)
        assert {s.weight_version for s in steps} == {final.weight_version}
        completions = [c for o in final.outputs for c in o.completions]
        pieces = 0
        for i, c in enumerate(completions):
            deltas = [d for s in steps for d in s.deltas if d.index == i]
            assert [t for d in deltas for t in d.token_ids] == c.token_ids
            assert [lp for d in deltas for lp in d.logprobs] == pytest.approx(c.logprobs, abs=1e-6)
            pieces += len(deltas)
            if (
                backend is hf
            ):  # its decode loop hands over every step; vLLM merges the deltas a reader has not taken yet
                assert len(deltas) == len(c.token_ids)
        assert pieces > len(completions), "no completion arrived in more than one piece"
        assert _tokens(final) == _tokens(await backend.generate(PROMPTS[:2], params)), "streaming changed the samples"
    if params.temperature == 0.0:
        assert _tokens((await _streamed(vllm, params))[1]) == _tokens(await hf.generate(PROMPTS[:2], params))
