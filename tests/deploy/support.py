"""Helpers for the deployment tests: paths, compose-file loading with ${VAR} interpolation, and
the map from a container command to the settings class of the service it starts."""

from __future__ import annotations

import importlib
import re
import secrets
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from corl import redis_auth
from corl.sandbox import remote

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "corl"
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DASHBOARD = CHART / "dashboards" / "corl.json"
VENV_BIN = Path(sys.executable).parent


def venv_tool(name: str) -> str:
    """A console script installed beside this interpreter (the project's .venv)."""
    path = VENV_BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {VENV_BIN}: run `pip install -e '.[dev]'`")
    return str(path)


# --- compose ------------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose-style ${VAR}, ${VAR:-default}, ${VAR:?error} substitution, recursively."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m["name"], m["op"], m["arg"]
        current = env.get(name)
        if op in (":-", "-"):
            return current if current not in (None, "") or (op == "-" and current is not None) else arg
        if op in (":?", "?"):
            if current in (None, "") if op == ":?" else current is None:
                raise KeyError(f"compose would refuse to start: {arg} (${{{name}}})")
            return current  # type: ignore[return-value]
        return current or ""

    return _VAR.sub(sub, value).replace("$$", "$")


# The secrets .env.example leaves for the user to set (the secrets-check service checks them).
SECRETS = (
    "CORL_ADMIN_TOKEN",
    "CORL_COHORT_TOKEN",
    "CORL_REDIS_PASSWORD",
    "CORL_SANDBOX_TOKEN",
    "GRAFANA_ADMIN_PASSWORD",
)


def user_env() -> dict[str, str]:
    """The user's `cp .env.example .env` with each secret set to a fresh random one."""
    env = read_env_file(ENV_EXAMPLE)
    env.update({name: secrets.token_urlsafe(24) for name in SECRETS})
    return env


USER_ENV = user_env()


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file as compose sees it: anchors merged, variables from a user's .env (USER_ENV)."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return interpolate(raw, USER_ENV if env is None else env)


def service_argv(svc: dict[str, Any]) -> list[list[str]]:
    """The corl command lines a service runs (image entrypoint is ``tini -- corl``).

    A ``/bin/sh -c`` service yields every ``corl ...`` command of its script."""
    command = svc.get("command") or []
    command = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    entry = svc.get("entrypoint")
    if entry is None:
        return [command]
    entry = shlex.split(entry) if isinstance(entry, str) else [str(c) for c in entry]
    if entry[-2:] == ["/bin/sh", "-c"] or entry[-2:] == ["sh", "-c"]:
        return shell_corl_commands(" ".join(command))
    raise AssertionError(f"unexpected entrypoint {entry}")


def shell_corl_commands(script: str) -> list[list[str]]:
    out: list[list[str]] = []
    for part in re.split(r"\|\||&&|;|\n", script):
        words = shlex.split(part)
        if words and words[0] == "corl":
            out.append(words[1:])
    return out


def container_argv(container: dict[str, Any]) -> list[str]:
    """The corl command line a Kubernetes container runs: its args under the image's ``tini -- corl``
    entrypoint, or what follows ``-m corl`` when it runs ``torchrun`` instead."""
    args = [str(a) for a in container.get("args", [])]
    command = [str(c) for c in container.get("command") or []]
    if not command:
        return args
    assert command[-1] == "torchrun", f"unexpected command {command}"
    i = next(i for i in range(len(args) - 1) if args[i : i + 2] == ["-m", "corl"])
    return args[i + 2 :]


def option_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


# --- services ---------------------------------------------------------------------------------

# Variables every corl process reads outside its settings class: the Redis password (corl.redis_auth)
# and where programs run (corl.sandbox.remote).
SHARED_ENV = (redis_auth.PASSWORD_ENV, redis_auth.PASSWORD_FILE_ENV, remote.SANDBOX_URL_ENV, remote.SANDBOX_TOKEN_ENV)


@dataclass(frozen=True)
class Role:
    """What a corl command line starts, and where that service's settings live."""

    name: str
    settings_module: str
    settings_class: str
    env_prefix: str


ROLES = {
    ("serve", "model"): Role("model", "corl.services.model.settings", "ServerSettings", "CORL_"),
    ("serve", "aggregator"): Role(
        "aggregator", "corl.services.aggregator.settings", "AggregatorSettings", "CORL_AGGREGATOR_"
    ),
    ("serve", "evaluator"): Role(
        "evaluator", "corl.services.evaluator.settings", "EvaluatorSettings", "CORL_EVALUATOR_"
    ),
    ("train",): Role("trainer", "corl.trainer.settings", "TrainerSettings", "CORL_TRAINER_"),
    ("serve", "sandbox"): Role("sandbox", "corl.services.sandbox.settings", "SandboxSettings", "CORL_SANDBOX_"),
    ("serve", "gateway"): Role("gateway", "corl.services.gateway.settings", "GatewaySettings", "CORL_GATEWAY_"),
}


def role_of(argv: list[str]) -> Role | None:
    for key, role in ROLES.items():
        if tuple(argv[: len(key)]) == key:
            return role
    return None


def settings_class(role: Role) -> type[BaseSettings]:
    module = importlib.import_module(role.settings_module)
    cls = getattr(module, role.settings_class, None)
    assert cls is not None, f"{role.settings_module} defines no {role.settings_class}"
    assert cls.model_config.get("env_prefix") == role.env_prefix, (
        f"{role.settings_class} env prefix is {cls.model_config.get('env_prefix')!r}, deployments use "
        f"{role.env_prefix!r}"
    )
    return cls


def env_names(cls: type[BaseSettings]) -> dict[str, str]:
    """Every environment variable a pydantic-settings class reads -> the field it sets.

    Nested models appear as ``PREFIX<FIELD><delimiter>`` prefixes (value ``field.``)."""
    cfg = cls.model_config
    prefix, delim = cfg.get("env_prefix", ""), cfg.get("env_nested_delimiter")
    names: dict[str, str] = {}
    for field_name, info in cls.model_fields.items():
        alias = info.validation_alias
        choices = getattr(alias, "choices", None)
        if choices is not None:
            for c in choices:
                if isinstance(c, str):
                    names[c.upper()] = field_name
                    names[(prefix + c).upper()] = field_name
        elif isinstance(alias, str):
            names[alias.upper()] = field_name
        else:
            names[(prefix + field_name).upper()] = field_name
        annotation = info.annotation
        if delim and isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            names[(prefix + field_name + delim).upper()] = field_name + "."
    return names


def unknown_env(cls: type[BaseSettings], env: dict[str, str]) -> list[str]:
    """CORL_* variables the settings class would silently ignore (a typo, or a setting that moved)."""
    names = env_names(cls)
    bad = []
    for var in env:
        if not var.startswith("CORL_"):
            continue
        if var.upper() in names or var in SHARED_ENV:
            continue
        nested = [n for n, f in names.items() if f.endswith(".") and var.upper().startswith(n)]
        if not nested:
            bad.append(var)
    return bad
