"""The aggregator as a reward server for outside trainers: OpenRLHF's ``/get_reward`` and slime's
``remote_rm`` at ``/v1/reward``, with the exact bodies those clients post, on fake members and a
real Redis (the aggregator's lifespan needs it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_aggregator import serve
from test_aggregator import aggregator, make_config

from corl.proto import ErrorResponse, OpenRLHFRewardResponse, SlimeRewardResponse
from corl.services.aggregator import AggregatorSettings, create_app
from corl.services.aggregator.testing import FakeCohort

# What OpenRLHF's remote_rm_fn posts (json={"query": queries, "prompts": prompts, "labels": labels}):
# queries are prompt + response as decoded by the trainer, with special tokens; G responses per prompt.
OPENRLHF_BODY: dict[str, Any] = {
    "query": ["12+34=46</s>", "12+34=47</s>", "12+34=x?</s>", "12+34=46", "50+50=100</s>", "50+50=10</s>"],
    "prompts": ["12+34=", "12+34=", "12+34=", "12+34=", "50+50=", "50+50="],
    "labels": ["46", "46", "46", "46", "100", "100"],
}


def cohort(accuracy: float = 1.0) -> FakeCohort:
    return FakeCohort.of("a", "b", "c", accuracy=accuracy)


async def test_openrlhf_payload_gets_one_consensus_reward_per_query_in_order(redis_url: str) -> None:
    fake = cohort()
    async with aggregator(make_config(["a", "b", "c"]), fake, redis_url) as (_, c):
        r = await c.post("/get_reward", json=OPENRLHF_BODY)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"rewards", "scores", "extra_logs", "weight_versions"}
    body = OpenRLHFRewardResponse.model_validate(r.json())
    assert body.rewards == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert body.scores == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # every member sample agrees with the right sum
    assert body.extra_logs["answer_parsed"] == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert body.extra_logs["cohort_labelled"] == [1.0] * 6
    assert body.weight_versions == {"a": 0, "b": 0, "c": 0}
    # Group-aware: the six responses to two prompts cost ONE generate call per member.
    assert [m.calls for m in fake.members.values()] == [1, 1, 1]


async def test_labels_are_never_read_in_label_free_mode(redis_url: str) -> None:
    poisoned = {**OPENRLHF_BODY, "labels": ["47"] * 4 + ["10"] * 2}
    async with aggregator(make_config(["a", "b", "c"]), cohort(), redis_url) as (_, c):
        honest = (await c.post("/get_reward", json=OPENRLHF_BODY)).json()
        lied = (await c.post("/get_reward", json=poisoned)).json()
    assert lied["rewards"] == honest["rewards"] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


async def test_ground_truth_mode_reads_the_labels(redis_url: str) -> None:
    fake = cohort(accuracy=0.0)  # the cohort is always wrong: only the labels can give these rewards
    poisoned = {**OPENRLHF_BODY, "labels": ["47"] * 4 + ["100"] * 2}
    settings = {"reward_server": {"mode": "ground_truth"}}
    async with aggregator(make_config(["a", "b", "c"]), fake, redis_url, **settings) as (_, c):
        r = await c.post("/get_reward", json=poisoned)
        missing = await c.post("/get_reward", json={**OPENRLHF_BODY, "labels": None})
    assert r.json()["rewards"] == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert [m.calls for m in fake.members.values()] == [0, 0, 0]  # no member sampling needed
    assert missing.status_code == 422 and ErrorResponse.model_validate(missing.json()).error.field == "labels"


async def test_samples_are_cached_and_shared_between_concurrent_requests(redis_url: str) -> None:
    fake = cohort()
    fake.slow = {"a": 0.2}
    async with aggregator(make_config(["a", "b", "c"]), fake, redis_url) as (svc, c):
        one = {"prompt": "07+08=", "response": "15", "label": None}
        many = await asyncio.gather(*(c.post("/v1/reward", json=one) for _ in range(8)))
        assert [r.json()["reward"] for r in many] == [1.0] * 8
        again = await c.post("/get_reward", json={"query": ["07+08=15"], "prompts": ["07+08="], "labels": [None]})
        assert again.json()["rewards"] == [1.0]
        counted = {
            s.labels["outcome"]: s.value
            for metric in svc.metrics.registry.collect()
            if metric.name == "corl_aggregator_reward_server_prompts"
            for s in metric.samples
            if s.name.endswith("_total")
        }
    # Eight concurrent requests for one prompt: one sampling; the later request hits the cache.
    assert [m.calls for m in fake.members.values()] == [1, 1, 1]
    assert counted == {"miss": 1.0, "shared": 7.0, "hit": 1.0}


@pytest.mark.parametrize(
    "prompt",
    ["07+08=", [{"role": "system", "content": "Add."}, {"role": "user", "content": "07+08="}]],
    ids=["text", "messages"],
)
async def test_slime_remote_rm_payload(redis_url: str, prompt: Any) -> None:
    async with aggregator(make_config(["a", "b"]), FakeCohort.of("a", "b", accuracy=1.0), redis_url) as (_, c):
        # slime's remote_rm: payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
        right = await c.post("/v1/reward", json={"prompt": prompt, "response": "15<|im_end|>", "label": "15"})
        wrong = await c.post("/v1/reward", json={"prompt": prompt, "response": "16", "label": 15})
    assert right.status_code == 200, right.text
    got = SlimeRewardResponse.model_validate(right.json())
    assert (got.reward, got.score, got.answer, got.consensus) == (1.0, 1.0, "15", "15")
    assert wrong.json()["reward"] == 0.0 and wrong.json()["answer"] == "16"


async def test_judge_mode_combines_member_grades(redis_url: str) -> None:
    fake = cohort()
    async with aggregator(make_config(["a", "b", "c"]), fake, redis_url, reward_server={"mode": "judge"}) as (_, c):
        r = await c.post("/v1/reward", json={"prompt": "12+34=", "response": "46", "label": None})
        w = await c.post("/v1/reward", json={"prompt": "12+34=", "response": "45", "label": None})
    assert r.json()["reward"] == pytest.approx(0.9) and w.json()["reward"] == pytest.approx(0.1)
    assert [m.grade_calls for m in fake.members.values()] == [2, 2, 2]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/get_reward", {"query": ["12+34=46"], "prompts": [], "labels": []}, "body"),
        ("/get_reward", {"query": [], "prompts": [], "labels": []}, "query"),
        ("/get_reward", {"query": ["12+34=46"]}, "prompts"),
        ("/get_reward", {"query": ["12+34=46"], "prompts": ["12+34="], "extra": 1}, "extra"),
        ("/get_reward", {"query": ["46"], "prompts": [" "]}, "prompts.0"),  # blank: refused by the schema
        ("/v1/reward", {"prompt": "12+34="}, "response"),
        ("/v1/reward", {"prompt": [{"role": "system", "content": "x"}], "response": "1"}, "body"),
    ],
)
async def test_wrong_shapes_get_422_in_the_common_error_shape(
    redis_url: str, path: str, body: dict[str, Any], field: str
) -> None:
    async with aggregator(make_config(["a", "b"]), FakeCohort.of("a", "b"), redis_url) as (_, c):
        r = await c.post(path, json=body)
    assert r.status_code == 422, r.text
    err = ErrorResponse.model_validate(r.json()).error
    assert err.type == "invalid_request" and err.field == field


async def test_slow_or_down_members_give_503_not_a_hang(redis_url: str) -> None:
    fake = FakeCohort.of("a", "b")
    fake.slow = {"a": 5.0, "b": 5.0}
    settings: dict[str, Any] = {"reward_server": {"timeout_s": 0.3}, "http": {"attempts": 1}}
    async with aggregator(make_config(["a", "b"]), fake, redis_url, **settings) as (_, c):
        slow = await c.post("/v1/reward", json={"prompt": "01+01=", "response": "2"})
        fake.slow, fake.down = {}, {"a", "b"}
        down = await c.post("/v1/reward", json={"prompt": "02+02=", "response": "4"})
    assert slow.status_code == 503 and "within 0.3s" in slow.json()["error"]["message"]
    assert down.status_code == 503 and ErrorResponse.model_validate(down.json()).error.type == "unavailable"


async def test_a_rollout_batch_has_its_own_body_bound(redis_url: str) -> None:
    # 256 responses of 4 KiB each (a CoT-sized batch) pass the 1 MiB bound of the grading routes.
    pad = " " * 4096
    queries, prompts = [f"12+34=46{pad}"] * 256, ["12+34="] * 256
    big: dict[str, Any] = {"query": queries, "prompts": prompts, "labels": [None] * 256}
    settings: dict[str, Any] = {"grading": {"max_body_bytes": 1 << 20}, "reward_server": {"max_body_bytes": 2 << 20}}
    async with aggregator(make_config(["a", "b"]), FakeCohort.of("a", "b", accuracy=1.0), redis_url, **settings) as (
        _,
        c,
    ):
        ok = await c.post("/get_reward", json=big)
        too_big = await c.post("/get_reward", json={"query": queries * 2, "prompts": prompts * 2})
        graders = await c.post(
            "/v1/graders", content=b"x" * (1 << 20) + b"x", headers={"content-type": "application/json"}
        )
    assert ok.status_code == 200 and ok.json()["rewards"] == [1.0] * 256
    assert too_big.status_code == 413 and too_big.json()["error"]["type"] == "payload_too_large"
    assert graders.status_code == 413  # the other routes keep their own bound


async def test_a_10_mb_reward_body_is_refused_before_it_is_read(redis_url: str) -> None:
    """The default bound: the body is never parsed (not even as JSON: it is not JSON)."""
    async with aggregator(make_config(["a", "b"]), FakeCohort.of("a", "b"), redis_url) as (_, c):
        for path in ("/get_reward", "/v1/reward"):
            r = await c.post(path, content=b"x" * (10 << 20), headers={"content-type": "application/json"})
            assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"


async def test_member_sampling_is_bounded(redis_url: str) -> None:
    fake = FakeCohort.of("a", "b", accuracy=1.0)
    fake.slow = {"a": 0.05}
    in_flight, peak = 0, 0
    handle = fake.handle

    async def counting(request: Any) -> Any:
        nonlocal in_flight, peak
        if request.url.host == "a.fake":
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return await handle(request)
        finally:
            if request.url.host == "a.fake":
                in_flight -= 1

    fake.handle = counting  # type: ignore[method-assign]
    settings = {"reward_server": {"max_concurrency": 2, "max_prompts_per_call": 1}}
    prompts = [f"{i:02d}+01=" for i in range(8)]
    body = {"query": [f"{p}{int(p[:2]) + 1}" for p in prompts], "prompts": prompts}
    async with aggregator(make_config(["a", "b"]), fake, redis_url, **settings) as (_, c):
        r = await c.post("/get_reward", json=body)
    assert r.json()["rewards"] == [1.0] * 8
    assert fake.members["a"].calls == 8 and peak == 2  # eight calls of one prompt each, two at a time


def test_running_aggregator_answers_openrlhf_and_slime_clients(redis_url: str) -> None:
    """On a real socket, posted the way the clients post: OpenRLHF's request_api_wrapper uses
    ``requests.post(url=..., json=data, headers={"Content-Type": "application/json"}, timeout=...)``
    and reads ``response.json()[score_key]``; slime's remote_rm posts the sample dict as JSON."""
    requests = pytest.importorskip("requests")  # what OpenRLHF posts with (a transformers dependency)

    settings = AggregatorSettings(
        config=Path("/nonexistent.yaml"),
        redis_url=redis_url,
        autostart=False,
        reward_server={"timeout_s": 5.0, "enabled": True},
    )  # type: ignore[call-arg]
    app = create_app(settings, config=make_config(["a", "b", "c"]), transport=cohort().transport())
    with serve(app) as url:
        t0 = time.monotonic()
        r = requests.post(
            url=f"{url}/get_reward", json=OPENRLHF_BODY, headers={"Content-Type": "application/json"}, timeout=180
        )
        s = requests.post(f"{url}/v1/reward", json={"prompt": "50+50=", "response": "100", "label": "100"}, timeout=30)
        elapsed = time.monotonic() - t0
    r.raise_for_status()
    assert r.json()["rewards"] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # one per query, in order
    assert s.json()["reward"] == 1.0 and elapsed < 5.0


async def test_the_reward_routes_are_off_unless_enabled_and_take_their_own_token(redis_url: str) -> None:
    body = {"prompt": "12+34=", "response": "46"}

    async def post(**reward_server: Any) -> list[int]:
        s = AggregatorSettings(
            config=Path("/nonexistent.yaml"), redis_url=redis_url, autostart=False, reward_server=reward_server
        )  # type: ignore[call-arg]
        app = create_app(s, config=make_config(["a", "b"]), transport=FakeCohort.of("a", "b").transport())
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agg") as c:
                return [
                    (await c.post("/v1/reward", json=body, headers=h)).status_code
                    for h in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer reward-secret"})
                ]

    assert await post() == [404, 404, 404]  # off by default
    assert await post(enabled=True) == [200, 200, 200]  # on, no token: for clients that send no headers
    assert await post(enabled=True, token="reward-secret") == [401, 401, 200]
