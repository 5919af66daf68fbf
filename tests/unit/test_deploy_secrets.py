"""Deployment secrets: the Redis password reaches every client beside the URL (never in the config), and
placeholder or short secrets are refused before a stack starts."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from typer.testing import CliRunner

from corl.cli import app
from corl.redis_auth import PASSWORD_ENV, PASSWORD_FILE_ENV, redis_auth
from corl.redis_server import LocalRedis
from corl.secrets_check import weak_secret


def _without_password(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    password = parts.password or ""
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port}")), password


def test_a_client_without_the_password_is_refused_and_one_given_it_by_the_deployment_connects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_FILE_ENV, raising=False)
    with LocalRedis(data_dir=tmp_path / "redis") as server:
        url, password = _without_password(server.url)  # as compose and Helm write it: no password
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url, **redis_auth()).xadd("corl:forged", {"reward": "1.0"})
        monkeypatch.setenv(PASSWORD_ENV, password)
        assert redis.Redis.from_url(url, **redis_auth()).ping()
        monkeypatch.delenv(PASSWORD_ENV)
        secret = tmp_path / "redis-password"
        secret.write_text(password + "\n")  # a mounted secret file: read, stripped
        monkeypatch.setenv(PASSWORD_FILE_ENV, str(secret))
        assert redis.Redis.from_url(url, **redis_auth()).ping()
        assert redis.Redis.from_url(server.url, **redis_auth()).ping()  # a password in the URL still works


def test_an_unreadable_or_empty_password_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="cannot read the Redis password"):
        redis_auth()
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match="empty"):
        redis_auth()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, "unset"),
        ("", "unset"),
        ("change-me-to-a-long-random-string", "a placeholder"),
        ("CHANGEME-please-0123456789", "a placeholder"),
        ("your-token-goes-here-123", "a placeholder"),
        ("password", "a placeholder"),
        ("s3cret-but-short", None),
        ("s3cret-short", "shorter than 16 characters"),
        ("qPD1PDSj0j0mc5k1ectoBn-zUF4OqW5M", None),
    ],
)
def test_weak_secrets_are_named(value: str | None, why: str | None) -> None:
    assert weak_secret(value) == why


def test_corl_secrets_check_exits_1_naming_each_weak_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A_TOKEN", "change-me-too-0123456789")
    monkeypatch.setenv("B_TOKEN", "qPD1PDSj0j0mc5k1ectoBn-zUF4OqW5M")
    monkeypatch.delenv("C_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["secrets", "check", "A_TOKEN", "B_TOKEN", "C_TOKEN"])
    assert result.exit_code == 1
    assert "A_TOKEN: a placeholder" in result.output and "C_TOKEN: unset" in result.output
    assert "B_TOKEN" not in result.output
    assert CliRunner().invoke(app, ["secrets", "check", "B_TOKEN"]).exit_code == 0
    made = CliRunner().invoke(app, ["secrets", "new"]).output.strip()
    assert weak_secret(made) is None
