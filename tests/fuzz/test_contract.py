"""Contract fuzzing: schemathesis (every check, every phase) against the live OpenAPI document of the
model server (tiny model), the aggregator, the evaluator and the gateway (real Redis): 0 server errors,
0 contract failures."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from hooks import CONTEXT_ENV, GATEWAY_MODEL_ENV, MODEL_DIR_ENV
from pydantic import SecretStr
from support import FUZZ_CONTEXT, FuzzRun, run_schemathesis

from corl.config import parse_config
from corl.services.aggregator import AggregatorSettings
from corl.services.aggregator import create_app as create_aggregator
from corl.services.aggregator.testing import FakeCohort
from corl.services.evaluator import EvaluatorSettings
from corl.services.evaluator import create_app as create_evaluator
from corl.services.gateway import GatewaySettings
from corl.services.gateway import create_app as create_gateway
from corl.services.gateway.testing import FakeUpstream, Router
from corl.services.model.app import create_app as create_model_app
from corl.services.model.testing import serve_app

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(400)]

ADMIN = "test-admin-token"  # tests/conftest.py server_settings
COHORT = "test-cohort-token"
REWARD = "test-reward-token"  # set here: the generate, grade and OpenAI routes declare the cohort scheme
MAX_EXAMPLES = 15  # per operation and phase: both services in < 3 minutes on 2 cores


# OpenRLHF's /get_reward takes one prompt per query, a rule JSON Schema cannot state; the hooks drop
# such bodies in the fuzzing phase, the coverage phase has no hook, so its declared 422 is expected.
GET_REWARD_LENGTHS = """
[[operations]]
include-path = "/get_reward"
checks.positive_data_acceptance.expected-statuses = [200, 422]
"""

# A format with ``conversation: true`` reads each prompt as a conversation (a JSON document the schema
# can only type as a string): the hooks drop other such bodies in the fuzzing phase; the coverage phase
# has no hook, so its 422 for them is expected on the two routes that take a format (beside the
# statuses expected by default).
CONVERSATION_PROMPTS = """
[[operations]]
include-path-regex = "^/v1/(generate|grade)$"
checks.positive_data_acceptance.expected-statuses = ["2XX", 401, 403, 404, 409, 422, 429, "5XX"]
"""


def operations(app: Any) -> int:
    """Every operation the app's OpenAPI document lists (a new route is fuzzed too)."""
    return sum(len(methods) for methods in app.openapi()["paths"].values())


def assert_clean(run: FuzzRun, operations: int) -> None:
    """Exit 0, every operation of the document tested, and every generated case passed."""
    print(run.output)  # the per-phase summary, shown with -s
    assert run.returncode == 0, run.output
    assert f"Operations:       {operations} selected / {operations} total" in run.output
    counts = re.search(r"(\d+) generated, (\d+) passed", run.output)
    assert counts and counts[1] == counts[2] and int(counts[1]) >= 10 * operations, run.output


def test_model_server_contract(server_settings: Any, fuzz_model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "weights"
    store.mkdir()
    # Small published bounds keep each generated request cheap; the fuzzer reads them from the schema.
    bounds = {"max_prompts": 4, "max_n": 4, "max_tokens": 8}
    settings = server_settings.model_copy(
        update={"model_dir": str(fuzz_model_dir), "weights_root": store, "cohort_token": SecretStr(COHORT), **bounds}
    )
    app = create_model_app(settings)
    with serve_app(app) as url:
        env = {MODEL_DIR_ENV: str(fuzz_model_dir), CONTEXT_ENV: str(FUZZ_CONTEXT)}
        run = run_schemathesis(
            url, {"admin": ADMIN, "cohort": COHORT}, tmp_path, MAX_EXAMPLES, env=env, extra_config=CONVERSATION_PROMPTS
        )
    assert_clean(run, operations(app))


def test_aggregator_contract(redis_url: str, tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "run_id": "fuzz",
            "members": [{"name": n, "model": "unused", "servers": [FakeCohort.url(n)]} for n in ("a", "b")],
            "rounds": {"prompt_source": {"kind": "http"}},
        }
    )
    settings = AggregatorSettings(
        config=Path("/nonexistent.yaml"),
        redis_url=redis_url,
        admin_token=ADMIN,
        autostart=False,  # no rounds: the routes are what is fuzzed
        grading={"max_wait_s": 0.2, "rate_limit_per_min": 100_000},
        reward_server={"enabled": True, "token": REWARD},
    )
    app = create_aggregator(settings, config=cfg, transport=FakeCohort.of("a", "b").transport())
    with serve_app(app) as url:
        reg = httpx.post(
            f"{url}/v1/graders", json={"name": "fuzzer", "mode": "pull"}, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert reg.status_code == 201, reg.text
        tokens = {"admin": ADMIN, "grader": reg.json()["token"], "reward": REWARD}
        run = run_schemathesis(url, tokens, tmp_path, MAX_EXAMPLES, extra_config=GET_REWARD_LENGTHS)
    assert_clean(run, operations(app))


def test_evaluator_contract(redis_url: str, tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "run_id": "fuzz-eval",
            "members": [{"name": n, "model": "unused", "servers": [FakeCohort.url(n)]} for n in ("a", "b")],
        }
    )
    fake = FakeCohort.of("a", "b")
    settings = EvaluatorSettings(config=Path("/nonexistent.yaml"), redis_url=redis_url, autostart=False, eval_prompts=8)
    app = create_evaluator(settings, config=cfg, transport=fake.sync_transport())
    with serve_app(app) as url:
        app.state.serving.poll()  # readings to serve
        run = run_schemathesis(url, {}, tmp_path, MAX_EXAMPLES)
    assert_clean(run, operations(app))


# The gateway forwards whatever the member takes: a well-formed request naming no member is a 404.
GATEWAY_MODELS = """
[[operations]]
include-path-regex = "^/v1/(chat/)?completions$"
checks.positive_data_acceptance.expected-statuses = [200, 404]
"""


def test_gateway_contract(redis_url: str, tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "run_id": "fuzz-gateway",
            "members": [{"name": n, "model": "unused", "servers": [f"http://{n}"]} for n in ("a", "b")],
            "gateway": {"harvest": {"routes": ["chat", "completions"]}},
        }
    )
    router = Router(a=FakeUpstream("a", record=False), b=FakeUpstream("b", record=False))
    settings = GatewaySettings(config=Path("/nonexistent.yaml"), redis_url=redis_url, cohort_token=COHORT)
    app = create_gateway(settings, config=cfg, transport=router.transport())
    with serve_app(app) as url:
        env = {GATEWAY_MODEL_ENV: "a"}
        run = run_schemathesis(url, {"cohort": COHORT}, tmp_path, MAX_EXAMPLES, env=env, extra_config=GATEWAY_MODELS)
    assert_clean(run, operations(app))
