"""``corl serve model``: flags override environment settings; nothing heavy runs to check that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corl.cli import app


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    import uvicorn

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda asgi, **kw: served.update(app=asgi, **kw))
    monkeypatch.setenv("CORL_PORT", "9001")
    monkeypatch.setenv("CORL_MAX_N", "5")
    monkeypatch.setenv("CORL_ADMIN_TOKEN", "from-env")
    result = CliRunner().invoke(
        app, ["serve", "model", "--model", str(tiny_model_dir), "--port", "9123", "--name", "a"]
    )
    assert result.exit_code == 0, result.output
    settings = served["app"].state.settings
    assert (served["port"], settings.port, settings.name, settings.max_n) == (9123, 9123, "a", 5)
    assert settings.admin_token.get_secret_value() == "from-env"
    assert settings.model_dir == str(tiny_model_dir.resolve())


def test_missing_model_dir_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "model", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "--model" in result.output


def test_weights_root_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    """``corl run`` passes ``--weights-root``; compose and helm set ``CORL_WEIGHTS_ROOT``."""
    import uvicorn

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda asgi, **kw: served.update(app=asgi, **kw))
    monkeypatch.setenv("CORL_WEIGHTS_ROOT", "/data/weights")
    model = ["serve", "model", "--model", str(tiny_model_dir)]
    assert CliRunner().invoke(app, model).exit_code == 0
    assert served["app"].state.settings.weights_root == Path("/data/weights")
    assert CliRunner().invoke(app, [*model, "--weights-root", "/run/w"]).exit_code == 0
    assert served["app"].state.settings.weights_root == Path("/run/w")
