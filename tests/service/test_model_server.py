"""The model server in-process (httpx.ASGITransport) with the real tiny model."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corl.proto import ErrorResponse, GenerateResponse, GradeResponse, InfoResponse, WeightUpdateResponse

WeightsFactory = Callable[..., tuple[Path, str]]
AUTH = {"Authorization": "Bearer test-admin-token"}  # tests/conftest.py ADMIN_TOKEN

GEN = {"prompts": ["12+34=", "07+08="], "n": 3, "max_tokens": 5}


def _greedy(prompt: str = "12+34=") -> dict:
    return {"prompts": [prompt], "n": 1, "max_tokens": 6, "temperature": 0.0}


async def test_generate_returns_n_samples_with_token_logprobs(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/generate", json=GEN)
    assert r.status_code == 200, r.text
    body = GenerateResponse.model_validate(r.json())
    assert body.model == "tiny" and body.weight_version == 0
    assert [res.prompt for res in body.results] == GEN["prompts"]
    for res in body.results:
        assert len(res.prompt_token_ids) == 6
        assert len(res.samples) == 3
        for s in res.samples:
            assert 1 <= len(s.token_ids) <= 5
            assert len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0.0 for lp in s.logprobs)
            assert s.finish_reason in ("stop", "length")


async def test_generate_seed_is_reproducible(client: httpx.AsyncClient) -> None:
    req = {**GEN, "seed": 7}
    a, b = (await client.post("/v1/generate", json=req)).json(), (await client.post("/v1/generate", json=req)).json()
    assert a == b


async def test_concurrent_requests_are_batched(client: httpx.AsyncClient, model_app: FastAPI) -> None:
    reqs = [{"prompts": [f"{i:02d}+11="], "n": 2, "max_tokens": 4} for i in range(8)]
    rs = await asyncio.gather(*(client.post("/v1/generate", json=q) for q in reqs))
    assert all(r.status_code == 200 for r in rs)
    # Each caller gets its own prompt back, even though calls were merged.
    assert [r.json()["results"][0]["prompt"] for r in rs] == [q["prompts"][0] for q in reqs]
    reg = model_app.state.metrics.registry
    calls = reg.get_sample_value("corl_server_batch_requests_count")
    merged = reg.get_sample_value("corl_server_batch_requests_sum")
    assert merged == 8 and calls < 8, f"{merged} requests in {calls} backend calls: nothing was merged"


async def test_trainer_recomputes_the_servers_top_p_log_probs(
    client: httpx.AsyncClient, model_app: FastAPI, make_weights: WeightsFactory
) -> None:
    """The sampling log-probs a server returns for top_p < 1 are what the trainer recomputes from the
    batch's sampling block on the same weights (the off-policy ratio is 1 on-policy)."""
    import torch
    from transformers import AutoModelForCausalLM

    from corl.proto import PromptGroup, SamplingSettings
    from corl.trainer.collate import pack
    from corl.trainer.losses import response_logps

    path, sha = make_weights(7)  # peaked distributions: a clear top-p nucleus
    assert (
        await client.post("/v1/weights", json={"version": 1, "uri": str(path), "sha256": sha}, headers=AUTH)
    ).status_code == 200
    sampling = SamplingSettings(temperature=0.9, top_p=0.6, max_tokens=6)
    req = {"prompts": ["12+34=", "7+8=", "1+1="], "n": 4, "seed": 3, **sampling.model_dump()}
    resp = GenerateResponse.model_validate((await client.post("/v1/generate", json=req)).json())
    rows = []
    for i, pr in enumerate(resp.results):
        samples = [
            {
                "sample_id": f"{i}-{j}",
                "response": smp.text,
                "response_token_ids": smp.token_ids,
                "logprobs": smp.logprobs,
                "finish_reason": smp.finish_reason,
                "weight_version": resp.weight_version,
                "reward": 0.0,
            }
            for j, smp in enumerate(pr.samples)
        ]
        group = PromptGroup(group_id=str(i), prompt=pr.prompt, prompt_token_ids=pr.prompt_token_ids, samples=samples)
        rows += [(group, smp) for smp in group.samples]
    batch = pack(rows, model_app.state.serving.backend.tokenizer.pad_token_id)
    # The trainer's view: the same weights loaded by transformers, whatever backend served them.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ids, attn, t = batch.input_ids, batch.attention_mask, batch.response_len
        logps, _ = response_logps(model, ids, attn, t, temperature=sampling.temperature, top_p=sampling.top_p)
        untruncated, _ = response_logps(model, ids, attn, t, temperature=sampling.temperature)
    mask = batch.response_mask
    assert float(((logps - batch.old_logps) * mask).abs().max()) < 1e-3  # float tolerance across kernels
    assert float(((untruncated - batch.old_logps) * mask).abs().max()) > 1e-2  # top-p really mattered


async def test_vote_grade_scores_in_unit_interval(client: httpx.AsyncClient) -> None:
    items = [{"prompt": "12+34=", "response": "46"}, {"prompt": "12+34=", "response": "no answer"}]
    r = await client.post("/v1/grade", json={"task": "addition", "items": items, "mode": "vote", "n_votes": 4})
    assert r.status_code == 200, r.text
    body = GradeResponse.model_validate(r.json())
    assert body.weight_version == 0 and len(body.scores) == 2
    assert body.scores[1] == 0.0  # an unparseable response never agrees


async def test_judge_grade_is_normalised_verdict_probability(client: httpx.AsyncClient, model_app: FastAPI) -> None:
    import torch

    r = await client.post(
        "/v1/grade", json={"task": "addition", "items": [{"prompt": "12+34=", "response": "46"}], "mode": "judge"}
    )
    assert r.status_code == 200, r.text
    score = r.json()["scores"][0]
    backend = model_app.state.serving.backend
    tok, model = backend.tokenizer, backend._active.model
    ids = tok("12+34=46?", return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        p = model(ids).logits[0, -1].softmax(-1)
    y, n = tok.convert_tokens_to_ids("Y"), tok.convert_tokens_to_ids("N")
    assert score == pytest.approx((p[y] / (p[y] + p[n])).item(), abs=1e-5)


async def test_a_judge_computes_the_next_token_logits_only(
    client: httpx.AsyncClient, model_app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory: a batch of long judge texts must not build batch x length x vocabulary logits."""
    model = model_app.state.serving.backend._active.model
    shapes: list[tuple[int, ...]] = []
    forward = model.forward

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        shapes.append(tuple(out.logits.shape))
        return out

    monkeypatch.setattr(model, "forward", recording)
    items = [{"prompt": "12+34=", "response": "46" * 10}, {"prompt": "1+1=", "response": "2"}]
    r = await client.post("/v1/grade", json={"task": "addition", "items": items, "mode": "judge"})
    assert r.status_code == 200, r.text
    assert shapes and all(s[1] == 1 for s in shapes), shapes  # B x 1 x V


async def test_info_health_ready_metrics(client: httpx.AsyncClient) -> None:
    info = InfoResponse.model_validate((await client.get("/v1/info")).json())
    assert (info.name, info.family, info.backend, info.chat_template) == ("tiny", "gpt2", "transformers", False)
    assert info.parameters > 0 and info.weight_version == 0
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready", "weight_version": 0}
    await client.post("/v1/generate", json=GEN)
    text = (await client.get("/metrics")).text
    assert 'corl_server_requests_total{route="/v1/generate",status="200"} 1.0' in text
    assert "corl_server_request_duration_seconds_bucket" in text
    assert "corl_server_generated_tokens_total" in text
    assert "corl_server_weight_version 0.0" in text


BAD_INPUT = [
    ("/v1/generate", {**GEN, "bogus": 1}, "bogus"),
    ("/v1/generate", {**GEN, "n": 17}, "n"),
    ("/v1/generate", {**GEN, "n": 0}, "n"),
    ("/v1/generate", {**GEN, "max_tokens": 33}, "max_tokens"),
    ("/v1/generate", {**GEN, "prompts": ["1+1="] * 9}, "prompts"),
    ("/v1/generate", {**GEN, "prompts": []}, "prompts"),
    ("/v1/generate", {**GEN, "prompts": ["1+1=", ""]}, "prompts.1"),
    ("/v1/generate", {**GEN, "prompts": ["9" * 60]}, "prompts.0"),  # 60 + 5 tokens > 64 positions
    ("/v1/generate", {**GEN, "max_tokens": 32, "prompts": ["9" * 40]}, "prompts.0"),
    ("/v1/generate", {**GEN, "temperature": -1}, "temperature"),
    ("/v1/generate", {**GEN, "top_p": 0}, "top_p"),
    ("/v1/generate", {"n": 2}, "prompts"),
    ("/v1/grade", {"task": "addition", "items": []}, "items"),
    ("/v1/grade", {"task": "addition", "items": [{"prompt": "1+1=", "response": "2"}], "mode": "guess"}, "mode"),
    ("/v1/grade", {"task": "addition", "items": [{"prompt": "1+1=", "response": "2"}], "n_votes": 17}, "n_votes"),
    ("/v1/grade", {"task": "addition", "items": [{"prompt": "1+1=", "response": "2", "x": 1}]}, "items.0.x"),
    ("/v1/grade", {"task": "addition", "items": [{"prompt": "1+1=", "response": "2"}] * 9}, "items"),
]


@pytest.mark.parametrize(("route", "body", "field"), BAD_INPUT)
async def test_bad_input_is_422_naming_the_field(client: httpx.AsyncClient, route: str, body: dict, field: str) -> None:
    r = await client.post(route, json=body)
    assert r.status_code == 422, r.text
    err = ErrorResponse.model_validate(r.json()).error
    assert err.type == "invalid_request" and err.field == field


async def test_malformed_json_is_422(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "body"


async def test_oversize_body_is_413(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/generate", json={**GEN, "prompts": ["1+1=" * 5000]})
    assert r.status_code == 413
    assert ErrorResponse.model_validate(r.json()).error.type == "payload_too_large"

    async def chunks():  # no Content-Length: bounded while streaming
        for _ in range(10):
            yield b" " * 4096

    r = await client.post("/v1/generate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


async def test_unknown_route_has_error_shape(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"


# --- weights -----------------------------------------------------------------------------------


def _update(version: int, uri: Path | str, sha256: str, fmt: str = "full") -> dict:
    return {"version": version, "uri": str(uri), "sha256": sha256, "format": fmt}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}])
async def test_weights_need_the_admin_token(
    client: httpx.AsyncClient, make_weights: WeightsFactory, headers: dict
) -> None:
    d, sha = make_weights(1)
    r = await client.post("/v1/weights", json=_update(1, d, sha), headers=headers)
    assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
    assert (await client.get("/v1/info")).json()["weight_version"] == 0


async def test_swap_changes_outputs_and_versions(
    client: httpx.AsyncClient, make_weights: WeightsFactory, model_app: FastAPI
) -> None:
    before = (await client.post("/v1/generate", json=_greedy())).json()
    d, sha = make_weights(1)
    r = await client.post("/v1/weights", json=_update(3, d, sha), headers=AUTH)
    assert r.status_code == 200, r.text
    up = WeightUpdateResponse.model_validate(r.json())
    assert (up.weight_version, up.previous_version) == (3, 0) and up.swap_seconds > 0
    after = (await client.post("/v1/generate", json=_greedy())).json()
    assert after["weight_version"] == 3
    assert after["results"][0]["samples"][0]["token_ids"] != before["results"][0]["samples"][0]["token_ids"]
    judge = {"task": "addition", "items": [{"prompt": "1+1=", "response": "2"}], "mode": "judge"}
    graded = (await client.post("/v1/grade", json=judge)).json()
    assert graded["weight_version"] == 3
    reg = model_app.state.metrics.registry
    assert reg.get_sample_value("corl_server_weight_version") == 3
    assert reg.get_sample_value("corl_server_last_swap_duration_seconds") > 0


async def _assert_still_serving_v0(client: httpx.AsyncClient, before: dict) -> None:
    now = (await client.post("/v1/generate", json=_greedy())).json()
    assert now == before  # same version, same greedy output: the old weights keep serving


async def test_stale_version_is_409_and_keeps_weights(client: httpx.AsyncClient, make_weights: WeightsFactory) -> None:
    d, sha = make_weights(1)
    assert (await client.post("/v1/weights", json=_update(2, d, sha), headers=AUTH)).status_code == 200
    before = (await client.post("/v1/generate", json=_greedy())).json()
    d2, sha2 = make_weights(2)
    for version in (2, 1):
        r = await client.post("/v1/weights", json=_update(version, d2, sha2), headers=AUTH)
        assert r.status_code == 409 and r.json()["error"]["type"] == "conflict"
    now = (await client.post("/v1/generate", json=_greedy())).json()
    assert now == before and now["weight_version"] == 2


async def test_bad_updates_are_422_and_keep_weights(
    client: httpx.AsyncClient, make_weights: WeightsFactory, tmp_path: Path
) -> None:
    before = (await client.post("/v1/generate", json=_greedy())).json()
    good, sha = make_weights(1)
    wrong_shape, wrong_sha = make_weights(3, n_embd=32)
    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    blob = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    from corl.weights_store import digest

    cases = [
        (_update(1, good, "0" * 64), "sha256"),  # bad checksum
        (_update(1, tmp_path / "missing", sha), "uri"),  # missing directory
        (_update(1, wrong_shape, wrong_sha), "uri"),  # shapes differ from the serving model
        (_update(1, truncated, digest(truncated)), "uri"),  # unreadable file, correct checksum
        (_update(1, good, sha, fmt="lora"), "uri"),  # not an adapter directory
    ]
    for body, field in cases:
        r = await client.post("/v1/weights", json=body, headers=AUTH)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"]["field"] == field, r.text
        await _assert_still_serving_v0(client, before)
    # ... and a good update still goes through afterwards.
    assert (await client.post("/v1/weights", json=_update(1, good, sha), headers=AUTH)).status_code == 200


async def test_lora_adapter_swap(client: httpx.AsyncClient, tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from corl.weights_store import digest

    before = (await client.post("/v1/generate", json=_greedy())).json()
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = LoraConfig(r=4, lora_alpha=64, target_modules=["c_attn", "c_fc"], init_lora_weights=False)
    adapter = tmp_path / "adapter"
    get_peft_model(base, lora).save_pretrained(adapter)
    r = await client.post("/v1/weights", json=_update(1, adapter, digest(adapter), "lora"), headers=AUTH)
    assert r.status_code == 200, r.text
    after = (await client.post("/v1/generate", json=_greedy())).json()
    assert after["weight_version"] == 1
    assert after["results"][0]["samples"][0]["token_ids"] != before["results"][0]["samples"][0]["token_ids"]
