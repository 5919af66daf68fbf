"""The dynamic batcher alone, with a recording fake generate function."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from corl.services.model.backends.base import Completion, GenerateOutput, PromptOutput, SamplingParams
from corl.services.model.batching import GenerateBatcher


class Recorder:
    def __init__(self, delay: float = 0.05) -> None:
        self.calls: list[tuple[list[str], SamplingParams]] = []
        self.delay = delay

    async def __call__(self, prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        self.calls.append((list(prompts), params))
        await asyncio.sleep(self.delay)
        outs = [PromptOutput([len(p)], [Completion(p.upper(), [1], [0.0], "stop")] * params.n) for p in prompts]
        return GenerateOutput(len(self.calls), outs)


async def _with_batcher(rec: Recorder, window_s: float, max_sequences: int = 1024) -> GenerateBatcher:
    b = GenerateBatcher(rec, window_s=window_s, max_sequences=max_sequences)
    b.start()
    return b


async def test_merges_compatible_and_splits_results() -> None:
    rec = Recorder()
    b = await _with_batcher(rec, window_s=0.01)
    p = SamplingParams(n=2, max_tokens=4)
    outs = await asyncio.gather(*(b.submit([f"q{i}", f"r{i}"], p) for i in range(6)))
    await b.close()
    assert len(rec.calls) < 6
    for i, out in enumerate(outs):  # each caller gets exactly its prompts, tagged with its batch's version
        assert [o.completions[0].text for o in out.outputs] == [f"Q{i}", f"R{i}"]
        assert 1 <= out.weight_version <= len(rec.calls)


async def test_incompatible_and_seeded_requests_are_not_merged() -> None:
    rec = Recorder()
    b = await _with_batcher(rec, window_s=0.01)
    reqs = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5),
        SamplingParams(seed=1),
        SamplingParams(seed=1),
    ]
    await asyncio.gather(*(b.submit(["x"], p) for p in reqs))
    await b.close()
    assert len(rec.calls) == 4 and all(len(prompts) == 1 for prompts, _ in rec.calls)


async def test_greedy_requests_merge_whatever_their_top_p() -> None:
    rec = Recorder()
    b = await _with_batcher(rec, window_s=0.05)
    await b.submit(["warm"], SamplingParams(temperature=0))
    await asyncio.gather(
        *(b.submit([str(i)], SamplingParams(temperature=0, top_p=tp)) for i, tp in enumerate([1.0, 0.5]))
    )
    await b.close()
    assert [len(prompts) for prompts, _ in rec.calls] == [1, 2]


async def test_lone_request_does_not_wait_for_the_window() -> None:
    rec = Recorder(delay=0.0)
    b = await _with_batcher(rec, window_s=5.0)
    t0 = time.perf_counter()
    for _ in range(3):
        await b.submit(["alone"], SamplingParams())
    await b.close()
    assert time.perf_counter() - t0 < 1.0


async def test_batch_respects_max_sequences() -> None:
    rec = Recorder()
    b = await _with_batcher(rec, window_s=0.01, max_sequences=8)
    await asyncio.gather(*(b.submit(["a", "b"], SamplingParams(n=2)) for _ in range(6)))
    await b.close()
    assert all(len(prompts) * 2 <= 8 for prompts, _ in rec.calls)


async def test_backend_failure_reaches_every_caller() -> None:
    async def broken(prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        raise RuntimeError("engine died")

    b = GenerateBatcher(broken, window_s=0.01, max_sequences=64)
    b.start()
    results = await asyncio.gather(*(b.submit(["x"], SamplingParams()) for _ in range(3)), return_exceptions=True)
    await b.close()
    assert all(isinstance(r, RuntimeError) for r in results)
