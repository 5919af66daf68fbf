"""Evaluation through a model server: greedy pass@1, maj@k with its tie rule, chunked requests with
progress, and the experiment's start/end readings taken from a run's snapshots."""

from __future__ import annotations

import json

import httpx
import pytest

from corl.embedded.evaluate import evaluate_server
from corl.experiment.runner import served_readings
from corl.proto import SamplingSettings
from corl.tasks import Example, get_task

EXAMPLES = [Example(prompt=f"q{i}", answer=str(i)) for i in range(5)]
# Sampled answers per prompt (k=4): q0 majority right; q1 majority wrong though one sample is right;
# q2 a 2-2 tie, the first-sampled (right) answer wins; q3 a tie whose first answer is wrong; q4 none readable.
SAMPLED = {
    "q0": ["0", "0", "9", "0"],
    "q1": ["7", "1", "7", "7"],
    "q2": ["2", "8", "8", "2"],
    "q3": ["8", "3", "3", "8"],
    "q4": [None, None, None, None],
}


def fake_server(requests: list[dict]):
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        greedy = body["temperature"] == 0.0
        results = []
        for p in body["prompts"]:
            i = int(p[1:])
            answers = [str(i) if i != 4 else "5"] if greedy else SAMPLED[p]  # greedy: right except q4
            samples = [
                {"text": "no idea" if a is None else f"so #### {a}", "token_ids": [1], "logprobs": [0.0],
                 "finish_reason": "stop"}
                for a in answers
            ]  # fmt: skip
            results.append({"prompt": p, "prompt_token_ids": [1], "samples": samples})
        return httpx.Response(200, json={"model": "m", "weight_version": 7, "results": results})

    return handle


def test_greedy_pass_at_1_and_majority_at_k_through_the_server() -> None:
    requests: list[dict] = []
    progress: list[int] = []
    sp = SamplingSettings(temperature=0.8, top_p=0.95, max_tokens=64, stop=[])
    with httpx.Client(transport=httpx.MockTransport(fake_server(requests))) as http:
        r = evaluate_server(http, "http://m", get_task("math"), EXAMPLES, sp, k=4, chunk=2, advance=progress.append)
    assert r.n == 5 and r.weight_version == 7 and r.k == 4
    assert r.pass_at_1 == pytest.approx(4 / 5)
    assert r.maj_at_k == pytest.approx(2 / 5)  # q0 and q2 (tie, first sampled answer right)
    assert r.sample_acc == pytest.approx((3 + 1 + 2 + 2 + 0) / 20)
    assert r.valid_rate == pytest.approx(16 / 20)
    assert r.distinct == pytest.approx((2 + 2 + 2 + 2 + 0) / 5)
    # 3 greedy requests then 3 sampled ones, 2 problems each (1 in the last); progress counts problems.
    assert [len(b["prompts"]) for b in requests] == [2, 2, 1, 2, 2, 1]
    assert [b["temperature"] for b in requests] == [0.0] * 3 + [0.8] * 3
    assert all(b["top_p"] == 0.95 and b["max_tokens"] == 64 for b in requests)
    assert [b["n"] for b in requests] == [1] * 3 + [4] * 3
    assert [b["seed"] for b in requests[3:]] == [0, 1, 2]  # sampled requests are seeded: maj@k is reproducible
    assert progress == [2, 2, 1, 2, 2, 1]
    assert r.row()["maj@4"] == r.maj_at_k and r.row()["k"] == 4


def test_greedy_only_when_k_is_below_two() -> None:
    requests: list[dict] = []
    sp = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=8, stop=[])
    with httpx.Client(transport=httpx.MockTransport(fake_server(requests))) as http:
        r = evaluate_server(http, "http://m", get_task("math"), EXAMPLES, sp, k=1, chunk=8)
    assert len(requests) == 1 and r.maj_at_k is None and r.sample_acc is None and r.pass_at_1 == pytest.approx(0.8)
    # No "maj@0" column of nulls. Every greedy answer reads ("so #### 4"), none is in the asked form (a
    # last line "#### x"): the reader's parsed and formatted shares beside the accuracy.
    assert r.row() == {"n": 5, "weight_version": 7, "pass@1": r.pass_at_1, "parsed": 1.0, "formatted": 0.0}


def test_a_server_error_is_raised_not_scored_as_wrong() -> None:
    sp = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=8, stop=[])
    failing = httpx.MockTransport(lambda req: httpx.Response(503, json={"detail": "swapping"}))
    with httpx.Client(transport=failing) as http, pytest.raises(httpx.HTTPStatusError):
        evaluate_server(http, "http://m", get_task("math"), EXAMPLES, sp)


def _snap(version: int | None, acc: float | None, distinct: float | None) -> dict:
    return {"members": {"a": {"accuracy_version": version, "accuracy": acc, "distinct_answers": distinct}}}


def test_served_readings_take_the_version_0_and_the_final_reading() -> None:
    history = [_snap(0, 0.25, None), _snap(0, 0.25, 3.0), _snap(0, 0.25, 3.0), _snap(5, 0.4, 2.0), _snap(9, 0.5, 1.0)]
    before, after = served_readings(history, "a", window=2)
    assert before == {"greedy_acc": 0.25, "distinct": 3.0}
    assert after == {"greedy_acc": 0.5, "distinct": 1.5}
    with pytest.raises(ValueError, match="version 0"):
        served_readings(history[3:], "a")


def test_thread_budget_shares_the_cores_among_the_runs_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    from corl.config import parse_config
    from corl.embedded.start import thread_env

    members = [{"name": n, "model": "m", "servers": ["http://127.0.0.1:1"]} for n in ("a", "b")]
    cfg = parse_config({"members": members})
    monkeypatch.delenv("CORL_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert thread_env(cfg, "CORL_NUM_THREADS") == {
        "CORL_NUM_THREADS": "2",
        "OMP_NUM_THREADS": "2",
    }  # 2 servers + 2 trainers
    assert thread_env(cfg, "CORL_NUM_THREADS", trainers=False)["CORL_NUM_THREADS"] == "4"  # servers only
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert thread_env(cfg, "CORL_NUM_THREADS")["CORL_NUM_THREADS"] == "1"  # never 0
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert thread_env(cfg, "CORL_NUM_THREADS")["OMP_NUM_THREADS"] == "3"  # the user's setting wins
