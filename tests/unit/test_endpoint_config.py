"""The ``endpoint:`` member kind in the cohort config: always frozen, reached by URL, its key only
ever named (an environment variable), and every path that serves models leaves it alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corl.config import ConfigError, dump_config, load_config, parse_config
from corl.embedded.config import embedded_config

SERVED = {"name": "a", "model": "unused", "servers": ["http://a:8000"]}
ENDPOINT = {"base_url": "http://127.0.0.1:8000/v1", "model": "ops-model", "api_key_env": "OPS_KEY"}


def cfg_with(member: dict[str, Any]) -> Any:
    return parse_config({"members": [SERVED, member]})


def test_an_endpoint_member_is_frozen_by_default_and_has_no_model_or_servers() -> None:
    cfg = cfg_with({"name": "ops-agent", "endpoint": ENDPOINT})
    ops = cfg.member("ops-agent")
    assert ops.role == "frozen" and ops.is_endpoint and ops.model is None and ops.servers == []
    assert ops.endpoint is not None and (ops.endpoint.api, ops.endpoint.n) == ("openai-chat", "auto")
    assert [m.name for m in cfg.served_members()] == ["a"]
    with pytest.raises(ValueError, match="outside endpoint"):
        ops.model_path()


@pytest.mark.parametrize(
    ("member", "problem"),
    [
        ({"name": "ops", "endpoint": ENDPOINT, "role": "trained"}, "never trains"),
        ({"name": "ops", "endpoint": ENDPOINT, "servers": ["http://x"]}, "takes no ['servers']"),
        ({"name": "ops", "endpoint": ENDPOINT, "model": "m"}, "takes no ['model']"),
        ({"name": "ops", "endpoint": ENDPOINT, "backend": "vllm"}, "takes no ['backend']"),
        ({"name": "ops", "endpoint": ENDPOINT, "lr": 1e-5}, "take no lr"),
        ({"name": "ops"}, "needs a model and at least one server, or an endpoint"),
        ({"name": "ops", "endpoint": {**ENDPOINT, "api": "anthropic"}}, "members.1.endpoint.api"),
        ({"name": "ops", "endpoint": {**ENDPOINT, "max_concurrency": 0}}, "members.1.endpoint.max_concurrency"),
        # A URL carries no secret: no query string, no user:password@.
        ({"name": "ops", "endpoint": {**ENDPOINT, "base_url": "https://h/v1?api-key=x"}}, "endpoint.base_url"),
        ({"name": "ops", "endpoint": {**ENDPOINT, "base_url": "https://u:p@h/v1"}}, "endpoint.base_url"),
    ],
)
def test_config_refuses(member: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        cfg_with(member)


def test_a_key_pasted_where_its_variable_name_goes_is_refused_without_echoing_it() -> None:
    key = "sk-proj-abc123-secret"
    with pytest.raises(ConfigError) as err:
        cfg_with({"name": "ops", "endpoint": {**ENDPOINT, "api_key_env": key}})
    assert "api_key_env" in str(err.value) and key not in str(err.value)


def test_the_key_comes_from_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = cfg_with({"name": "ops", "endpoint": ENDPOINT}).member("ops").endpoint
    assert ops is not None
    monkeypatch.delenv("OPS_KEY", raising=False)
    with pytest.raises(KeyError, match="OPS_KEY"):
        ops.api_key()
    monkeypatch.setenv("OPS_KEY", "the-value")
    key = ops.api_key()
    assert key is not None and key.get_secret_value() == "the-value" and "the-value" not in repr(key)
    keyless = cfg_with({"name": "ops", "endpoint": {**ENDPOINT, "api_key_env": None}}).member("ops").endpoint
    assert keyless is not None and keyless.api_key() is None


def test_a_dumped_config_reads_back_and_names_only_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPS_KEY", "never-in-files")
    cfg = cfg_with({"name": "ops", "endpoint": ENDPOINT})
    dump_config(cfg, tmp_path / "cohort.yaml")
    text = (tmp_path / "cohort.yaml").read_text()
    assert "OPS_KEY" in text and "never-in-files" not in text
    assert load_config(tmp_path / "cohort.yaml").member("ops") == cfg.member("ops")


def test_the_embedded_run_gives_loopback_servers_to_served_members_only(tmp_path: Path) -> None:
    base = cfg_with({"name": "ops", "endpoint": ENDPOINT})
    cfg = embedded_config(tmp_path, tmp_path, "redis://127.0.0.1:1/0", base=base)
    a, ops = cfg.member("a"), cfg.member("ops")
    assert a.servers[0].startswith("http://127.0.0.1:") and a.servers != SERVED["servers"]
    assert ops.servers == [] and ops.endpoint == base.member("ops").endpoint
