"""Outside OpenAI-compatible endpoints as frozen members: the aggregator in-process, the endpoint and
the model servers faked with ``httpx.MockTransport`` (``FakeEndpoint``, ``FakeCohort``), real Redis.

Each failure of a remote API gives its documented behaviour (``endpoints/client.py``, ``retry.py``):
429 and 5xx are retried (after ``Retry-After`` when given), a read timeout leaves the member out of
the round and it comes back by itself, an unreadable reply or a missing choice is a sample with no
answer, a server that refuses ``n > 1`` gets one request per sample from then on.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_aggregator import ADMIN_AUTH, ROUND_DEFAULTS, aggregator, read_batches, sync_redis

from corl.config import CohortConfig, dump_config, parse_config
from corl.preflight import PreflightError, endpoint_keys
from corl.proto import DashboardView, RunStats
from corl.services.aggregator.testing import FakeCohort, FakeEndpoint

_runs = itertools.count()
KEY_ENV = "CORL_TEST_OPS_KEY"
KEY = "sk-live-7f3a91c04be2d5e86a1f"  # a value that must never appear anywhere but the request header
FAST = {"http": {"backoff_initial_s": 0.01, "attempts": 2}}  # the model servers' retries


def config(
    *, endpoint: dict[str, Any] | None = None, reward: dict[str, Any] | None = None, **rounds: Any
) -> CohortConfig:
    return parse_config(
        {
            "run_id": f"ep-{next(_runs)}",
            "members": [
                {"name": "a", "model": "unused", "servers": [FakeCohort.url("a")]},
                {"name": "b", "model": "unused", "servers": [FakeCohort.url("b")]},
                {
                    "name": "ops",
                    "endpoint": {"base_url": "http://ops.endpoint/v1", "model": "ops-model", **(endpoint or {})},
                },
            ],
            "rounds": {**ROUND_DEFAULTS, **rounds},
            "reward": reward or {"mode": "peer_pool"},
        }
    )


def cohort(ep: FakeEndpoint, accuracy: float = 0.8) -> FakeCohort:
    fake = FakeCohort.of("a", "b", accuracy=accuracy)
    fake.endpoints[ep.name] = ep
    return fake


async def stats_of(client: Any, cfg: CohortConfig) -> RunStats:
    return RunStats.model_validate_json((await client.get(f"/v1/runs/{cfg.run_id}/stats")).content)


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv(KEY_ENV, KEY)
    yield KEY_ENV


async def test_endpoint_samples_vote_in_every_round_and_it_gets_no_batches(redis_url: str, key_env: str) -> None:
    # The served members never answer right; the endpoint always does: peer_pool labels can only be
    # right when the endpoint's samples are among the votes.
    cfg = config(endpoint={"api_key_env": key_env})
    ep = FakeEndpoint("ops", accuracy=1.0, key=KEY)
    async with aggregator(cfg, cohort(ep, accuracy=0.0), redis_url, **FAST) as (svc, client):
        results = [await svc.driver.run_round() for _ in range(2)]
        stats = await stats_of(client, cfg)
        view = DashboardView.model_validate((await client.get(f"/v1/runs/{cfg.run_id}/dashboard")).json())
        metrics = (await client.get("/metrics")).text
    assert [(r.status, r.written, r.missing) for r in results] == [("ok", ["a", "b"], [])] * 2
    assert read_batches(redis_url, cfg, "ops") == []  # never trained: no stream
    for rnd in stats.rounds:
        assert set(rnd.members) == {"a", "b", "ops"} and not rnd.members["ops"].batch_written
        assert rnd.members["a"].label_accuracy == 1.0 and rnd.members["b"].label_accuracy == 1.0
        assert rnd.members["ops"].label_share == 1.0  # the endpoint's answer was every label
        assert rnd.members["ops"].mean_response_tokens == 2.0  # from the replies' usage: no token ids
    # One request per prompt with n = G and the round's sampling settings, the key as a Bearer token.
    sampling, g = cfg.sampling(), cfg.rounds.samples_per_prompt
    assert len(ep.bodies) == 2 * cfg.rounds.prompts_per_round
    for body in ep.bodies:
        assert body["n"] == g and body["model"] == "ops-model" and body["max_tokens"] == sampling.max_tokens
        assert (body["temperature"], body["top_p"]) == (sampling.temperature, sampling.top_p)
        assert [m["role"] for m in body["messages"]] == ["user"]
    assert len({b["seed"] for b in ep.bodies}) == len(ep.bodies)
    assert set(ep.seen_auth) == {f"Bearer {KEY}"}
    counted = stats.endpoints["ops"]
    assert (counted.requests, counted.retries, counted.failed_calls, counted.n_per_request) == (8, 0, 0, True)
    assert (counted.samples, counted.no_answer_samples) == (2 * 4 * g, 0)
    assert (counted.prompt_tokens, counted.completion_tokens) == (8 * 7, 8 * 2 * g)
    assert counted.mean_latency_s is not None and counted.verdicts == {"logprobs": 0, "text": 0, "unread": 0}
    ops = next(m for m in view.members if m.name == "ops")
    assert ops.role == "frozen" and ops.weight_version is None and ops.endpoint == counted
    assert 'corl_aggregator_endpoint_tokens_total{kind="completion",member="ops"} 64.0' in metrics
    assert 'corl_aggregator_endpoint_requests_total{member="ops",outcome="ok"} 8.0' in metrics
    assert 'corl_aggregator_endpoint_request_duration_seconds_count{member="ops"} 8.0' in metrics


async def test_a_completions_endpoint_gets_the_plain_template(redis_url: str) -> None:
    cfg = config(endpoint={"api": "openai-completions"})
    ep = FakeEndpoint("ops")
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, client):
        assert (await svc.driver.run_round()).missing == []
        stats = await stats_of(client, cfg)
    prompts = [g.prompt for g in read_batches(redis_url, cfg, "a")[0].groups]
    assert [b["prompt"] for b in ep.bodies] == prompts and all("messages" not in b for b in ep.bodies)
    assert stats.endpoints["ops"].no_answer_samples == 0 and ep.seen_auth == [None] * len(prompts)  # no key


@pytest.mark.parametrize(
    ("script", "headers", "retries", "rate_limited"),
    [
        pytest.param([429], {"Retry-After": "1"}, 1, 1, id="429-retry-after"),
        pytest.param([500], {}, 1, 0, id="500-then-success"),
        pytest.param([503, 502], {}, 2, 0, id="two-5xx"),
        pytest.param(["connect_error"], {}, 1, 0, id="connection-refused-once"),
    ],
)
async def test_transient_failures_are_retried(
    redis_url: str, script: list[Any], headers: dict[str, str], retries: int, rate_limited: int
) -> None:
    cfg = config(endpoint={"n": "yes"})
    ep = FakeEndpoint("ops", script=list(script), headers=headers)
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, client):
        t0 = time.monotonic()
        res = await svc.driver.run_round()
        took = time.monotonic() - t0
        counted = (await stats_of(client, cfg)).endpoints["ops"]
    assert (res.status, res.missing) == ("ok", [])
    assert (counted.retries, counted.rate_limited, counted.failed_calls, counted.no_answer_samples) == (
        retries,
        rate_limited,
        0,
        0,
    )
    assert counted.requests == cfg.rounds.prompts_per_round + retries
    if "Retry-After" in headers:
        assert took >= 1.0  # the wait the server asked for, not the 10 ms backoff


async def test_a_retry_after_longer_than_the_bound_fails_at_once(redis_url: str) -> None:
    cfg = config(endpoint={"n": "yes", "max_retry_wait_s": 5})
    ep = FakeEndpoint("ops", script=[429], headers={"Retry-After": "3600"})
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, client):
        t0 = time.monotonic()
        res = await svc.driver.run_round()
        assert time.monotonic() - t0 < 5
        counted = (await stats_of(client, cfg)).endpoints["ops"]
    assert (res.status, res.missing) == ("ok", ["ops"])
    assert (counted.retries, counted.rate_limited, counted.failed_calls, counted.last_error) == (0, 1, 1, "HTTP 429")


async def test_a_read_timeout_leaves_the_endpoint_out_and_it_comes_back(redis_url: str) -> None:
    cfg = config(endpoint={"n": "yes", "attempts": 3})
    ep = FakeEndpoint("ops", script=["timeout"])
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, client):
        first = await svc.driver.run_round()
        second = await svc.driver.run_round()
        stats = await stats_of(client, cfg)
        metrics = (await client.get("/metrics")).text
    assert (first.status, first.written, first.missing) == ("ok", ["a", "b"], ["ops"])
    assert (second.status, second.missing) == ("ok", [])
    assert stats.rounds[0].missing == ["ops"] and "ops" in stats.rounds[1].members
    counted = stats.endpoints["ops"]
    assert (counted.failed_calls, counted.retries, counted.last_error) == (1, 0, "ReadTimeout")  # not retried
    assert 'corl_aggregator_member_failures_total{member="ops"} 1.0' in metrics
    assert 'corl_aggregator_endpoint_requests_total{member="ops",outcome="timeout"} 1.0' in metrics


@pytest.mark.parametrize(
    ("script", "no_answer", "present"),
    [
        pytest.param(["invalid_json"], 4, True, id="invalid-json-one-reply"),
        pytest.param(["no_choices"], 4, True, id="no-choices-one-reply"),
        pytest.param(["huge"], 4, True, id="reply-over-the-byte-bound"),
        pytest.param(["short"], 1, True, id="fewer-choices-than-n"),
        pytest.param(["no_content"], 4, True, id="choices-without-content"),
        pytest.param(["invalid_json"] * 4, 0, False, id="no-reply-readable"),
    ],
)
async def test_malformed_and_short_answers_are_no_answer_samples(
    redis_url: str, script: list[Any], no_answer: int, present: bool
) -> None:
    cfg = config(endpoint={"n": "yes"})  # G = 4 samples of 4 prompts, one request each
    ep = FakeEndpoint("ops", script=list(script))
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, client):
        res = await svc.driver.run_round()
        stats = await stats_of(client, cfg)
    assert res.status == "ok" and (res.missing == []) == present
    counted = stats.endpoints["ops"]
    assert counted.no_answer_samples == no_answer and counted.failed_calls == (0 if present else 1)
    if present:
        ops = stats.rounds[0].members["ops"]
        # A no-answer sample never votes: it lowers the endpoint's valid share, nothing else.
        assert ops.distinct_answers >= 0 and counted.samples == 16
        assert (counted.retries, counted.rate_limited) == (0, 0)  # a 200 with a bad body is not retried


@pytest.mark.parametrize(("behaviour", "probe_requests"), [("reject", 1), ("ignore", 1)])
async def test_a_server_without_n_gets_one_request_per_sample_from_then_on(
    redis_url: str, behaviour: str, probe_requests: int
) -> None:
    cfg = config()  # n: auto
    ep = FakeEndpoint("ops", n=behaviour)  # type: ignore[arg-type]
    g, p = cfg.rounds.samples_per_prompt, cfg.rounds.prompts_per_round
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, client):
        results = [await svc.driver.run_round() for _ in range(2)]
        counted = (await stats_of(client, cfg)).endpoints["ops"]
    assert [(r.status, r.missing) for r in results] == [("ok", [])] * 2
    asked_n = [b["n"] for b in ep.bodies]
    assert asked_n.count(g) == probe_requests  # asked once, remembered
    # The probe's prompt: one request with n (refused, or answered with one choice), then one per
    # sample it still needs; every other prompt of both rounds: G requests of one sample.
    first_prompt = g if behaviour == "reject" else g - 1
    assert asked_n.count(1) == first_prompt + (2 * p - 1) * g
    assert counted.n_per_request is False and counted.no_answer_samples == 0 and counted.failed_calls == 0
    for prompt in {b["messages"][0]["content"] for b in ep.bodies}:
        seeds = [b["seed"] for b in ep.bodies if b["messages"][0]["content"] == prompt and b["n"] == 1]
        assert len(set(seeds)) == len(seeds)  # G different draws, not one draw G times


async def test_concurrency_bound_per_endpoint(redis_url: str) -> None:
    cfg = config(endpoint={"n": "no", "max_concurrency": 2})
    ep = FakeEndpoint("ops", delay_s=0.02)
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, _):
        assert (await svc.driver.run_round()).missing == []
    assert len(ep.bodies) == 16 and ep.max_in_flight == 2


async def test_a_run_with_the_endpoint_down_keeps_going_by_quorum(redis_url: str) -> None:
    cfg = config(endpoint={"attempts": 2})
    ep = FakeEndpoint("ops", down=True)
    async with aggregator(cfg, cohort(ep), redis_url, **FAST) as (svc, _):
        down = [await svc.driver.run_round() for _ in range(2)]
        ep.down = False
        back = await svc.driver.run_round()
    assert [(r.status, r.written, r.missing) for r in down] == [("ok", ["a", "b"], ["ops"])] * 2
    assert (back.status, back.missing) == ("ok", [])

    strict = config(endpoint={"attempts": 1}, min_quorum=3)
    ep = FakeEndpoint("ops", down=True)
    async with aggregator(strict, cohort(ep), redis_url, **FAST) as (svc, _):
        held = await svc.driver.run_round()
        ep.down = False
        retried = await svc.driver.run_round()
    assert (held.status, held.missing) == ("no_quorum", ["ops"])
    assert (retried.status, retried.round) == ("ok", 0)  # the same round, taken again


@pytest.mark.parametrize(
    ("api", "logprobs", "source"),
    [
        ("openai-chat", "return", "logprobs"),
        ("openai-chat", "reject", "text"),
        ("openai-chat", "omit", "text"),
        ("openai-completions", "return", "logprobs"),
    ],
)
async def test_an_endpoint_judges_in_peer_judge(redis_url: str, api: str, logprobs: str, source: str) -> None:
    cfg = config(endpoint={"api": api, "n": "yes"}, reward={"mode": "peer_judge", "judge": {"k": 2}})
    ep = FakeEndpoint("ops", logprobs=logprobs)  # type: ignore[arg-type]
    async with aggregator(cfg, cohort(ep), redis_url) as (svc, client):
        res = await svc.driver.run_round()
        counted = (await stats_of(client, cfg)).endpoints["ops"]
    assert (res.status, res.written, res.missing) == ("ok", ["a", "b"], [])
    judged = [b for b in ep.bodies if b["temperature"] == 0.0]
    # k = 2 of 2 peers: the endpoint judges every sample of a and b (2 x 4 prompts x 4 samples).
    assert counted.verdicts == {"logprobs": 0, "text": 0, "unread": 0} | {source: 32}
    assert len(judged) == 32 + (logprobs == "reject")  # a refused request is asked again without logprobs
    assert all(b["max_tokens"] == 4 and b["n"] == 1 for b in judged)
    if logprobs == "reject":  # refused once, then never asked for again
        assert sum(1 for b in judged if b.get("logprobs")) == 1
    # Both of a's judges (b and the endpoint) are honest: a right answer is rewarded, a wrong one not.
    for group, sample in read_batches(redis_url, cfg, "a")[0].samples():
        a, b = group.prompt.rstrip("=").split("+")
        assert (sample.reward > 0.5) == (sample.response.strip() == str(int(a) + int(b))), (group.prompt, sample)


async def test_the_api_key_appears_in_no_log_stats_metrics_or_run_state(
    redis_url: str, key_env: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, httpx's own request lines included
    cfg = config(endpoint={"api_key_env": key_env, "attempts": 2}, reward={"mode": "peer_judge"})
    # Failures are where keys leak: a retried 500, a timeout (the call fails, logged), then rounds that work.
    ep = FakeEndpoint("ops", key=KEY, script=[500, "timeout"])
    async with aggregator(cfg, cohort(ep), redis_url, **FAST) as (svc, client):
        for _ in range(3):
            await svc.driver.run_round()
        ep.key = "a-different-key"  # the server now refuses the key (401): logged, counted
        await svc.driver.run_round()
        answers = [
            (await client.get(f"/v1/runs/{cfg.run_id}/stats")).text,
            (await client.get(f"/v1/runs/{cfg.run_id}/dashboard")).text,
            (await client.get("/metrics")).text,
            (await client.get("/dashboard")).text,
            (await client.post("/v1/graders", json={"name": "g1", "mode": "pull"}, headers=ADMIN_AUTH)).text,
        ]
        stats = RunStats.model_validate_json(answers[0])
    assert stats.endpoints["ops"].last_error == "HTTP 401" and stats.endpoints["ops"].failed_calls >= 2
    assert any("ops" in r.getMessage() for r in caplog.records)  # the failures were logged ...
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for record in caplog.records:
        assert KEY not in formatter.format(record), record.name  # ... without the key (tracebacks too)
    for text in answers:
        assert KEY not in text
    # Everything the run keeps in Redis, and the config file a run directory holds.
    r = sync_redis(redis_url)
    read = {
        "stream": r.xrange,
        "hash": r.hgetall,
        "string": r.get,
        "list": lambda k: r.lrange(k, 0, -1),
        "zset": lambda k: r.zrange(k, 0, -1),
        "set": r.smembers,
    }
    kept = [repr(read[r.type(k).decode()](k)) for k in r.scan_iter(f"corl:{cfg.run_id}:*")]
    assert len(kept) > 3 and not any(KEY in text for text in kept)
    dump_config(cfg, tmp_path / "cohort.yaml")
    text = (tmp_path / "cohort.yaml").read_text()
    assert KEY not in text and key_env in text


async def test_a_missing_key_variable_stops_the_start_naming_the_variable(redis_url: str) -> None:
    cfg = config(endpoint={"api_key_env": "CORL_TEST_UNSET_KEY"})
    with pytest.raises(KeyError, match="CORL_TEST_UNSET_KEY"):
        async with aggregator(cfg, cohort(FakeEndpoint("ops")), redis_url):
            pass
    with pytest.raises(PreflightError, match="member ops: environment variable CORL_TEST_UNSET_KEY"):
        endpoint_keys(cfg)


# --- the invariants, with an endpoint member among the voters -------------------------------------

PROMPTS = [f"{i:02d}+{i + 1:02d}=" for i in range(4)]


async def _round_rewards(
    redis_url: str, mode: str, answers: list[str], accuracy_a: float
) -> tuple[dict[str, list[tuple[str, str | None, float]]], RunStats]:
    cfg = config(reward={"mode": mode}, prompt_source={"kind": "http"})
    fake = cohort(FakeEndpoint("ops", accuracy=0.7), accuracy=0.6)
    fake.members["a"].accuracy = accuracy_a
    async with aggregator(cfg, fake, redis_url) as (svc, client):
        body = {"prompts": [{"prompt": p, "answer": t} for p, t in zip(PROMPTS, answers, strict=True)]}
        assert (await client.post("/v1/prompts", json=body, headers=ADMIN_AUTH)).status_code == 200
        assert (await svc.driver.run_round()).missing == []
        stats = await stats_of(client, cfg)
    rewards = {
        m: [(g.prompt, s.answer, s.reward) for g, s in read_batches(redis_url, cfg, m)[0].samples()] for m in "ab"
    }
    return rewards, stats


@pytest.mark.parametrize("mode", ["peer_label", "peer_pool", "peer_agreement"])
async def test_dataset_answers_never_reach_rewards_with_an_endpoint_voting(redis_url: str, mode: str) -> None:
    truth = [str(2 * i + 1) for i in range(4)]
    honest, stats = await _round_rewards(redis_url, mode, truth, 0.6)
    poisoned, poisoned_stats = await _round_rewards(redis_url, mode, ["999"] * 4, 0.6)
    assert honest == poisoned
    assert stats.rounds[0].members["ops"].pseudo_label_accuracy != 0.0  # the poisoning was seen ...
    assert poisoned_stats.rounds[0].members["ops"].pseudo_label_accuracy == 0.0  # ... by diagnostics only


@pytest.mark.parametrize("mode", ["peer_label", "peer_pool"])
async def test_a_members_reward_never_depends_on_its_own_samples_with_an_endpoint_voting(
    redis_url: str, mode: str
) -> None:
    """Other samples of member a, same peers (b and the endpoint): each answer of a earns the same reward."""
    truth = [str(2 * i + 1) for i in range(4)]
    rewards = [(await _round_rewards(redis_url, mode, truth, acc))[0]["a"] for acc in (0.2, 0.9)]
    table: dict[tuple[str, str | None], set[float]] = {}
    for run in rewards:
        for prompt, answer, reward in run:
            table.setdefault((prompt, answer), set()).add(reward)
    assert all(len(r) == 1 for r in table.values()), table
    shared = {(p, a) for p, a, _ in rewards[0]} & {(p, a) for p, a, _ in rewards[1]}
    assert any(table[k] == {1.0} for k in shared)  # answers both runs gave, rewarded alike (not vacuous)


# --- the reward server for outside trainers, with an endpoint member --------------------------------

REWARD_BODY = {"query": ["12+34=46", "12+34=47", "50+50=100"], "prompts": ["12+34=", "12+34=", "50+50="]}


@pytest.mark.parametrize("mode", ["consensus", "judge"])
async def test_the_reward_server_asks_the_endpoint_too(redis_url: str, mode: str) -> None:
    cfg = config(endpoint={"n": "yes"}, min_quorum=2)
    ep = FakeEndpoint("ops", accuracy=1.0)
    fake = cohort(ep, accuracy=0.0)
    fake.members["a"].accuracy = 1.0  # a is right, b is not: without the endpoint their labels tie
    for m in fake.members.values():
        m.judge = "always_one" if mode == "judge" else "honest"
    settings: dict[str, Any] = {"reward_server": {"mode": mode, "samples_per_prompt": 8}}
    async with aggregator(cfg, fake, redis_url, **settings) as (_, client):
        r = await client.post("/get_reward", json=REWARD_BODY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["weight_versions"]["ops"] == 0 and ep.bodies
    if mode == "consensus":
        # The consensus is the plurality of the members' pseudo-labels: a's and the endpoint's.
        assert body["rewards"] == [1.0, 0.0, 1.0]
    else:
        # a and b score everything 1; the endpoint's verdicts (0.9 / 0.1) pull the wrong one down.
        assert body["rewards"][1] < body["rewards"][0] and body["rewards"][1] < body["rewards"][2]
        assert all(b["temperature"] == 0.0 for b in ep.bodies)
