"""docker-compose.yml: valid against the compose spec, and every service it starts is accepted by
the real CLI and the real settings classes, with the cohort config it mounts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic import SecretStr
from typer.testing import CliRunner

from corl.cli import app as corl_app
from corl.config import load_config

from .support import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    ROOT,
    SECRETS,
    USER_ENV,
    interpolate,
    load_compose,
    option_value,
    read_env_file,
    role_of,
    service_argv,
    settings_class,
    unknown_env,
    venv_tool,
)

COMPOSE = load_compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
CORL_SERVICES = sorted(n for n, s in SERVICES.items() if str(s.get("image", "")).startswith("corl:"))
COMMANDS = [(n, argv) for n in CORL_SERVICES for argv in service_argv(SERVICES[n])]


def _bind_source(svc: dict[str, Any], container_path: str) -> Path | None:
    """The host file a bind mount puts at ``container_path`` in this service."""
    for vol in svc.get("volumes", []):
        if isinstance(vol, dict) and vol.get("type") == "bind" and vol["target"] == container_path:
            return (ROOT / vol["source"]).resolve()
        if isinstance(vol, str):
            parts = vol.split(":")
            if len(parts) >= 2 and parts[1] == container_path and parts[0].startswith("."):
                return (ROOT / parts[0]).resolve()
    return None


def test_compose_file_matches_the_compose_spec() -> None:
    out = subprocess.run(
        [venv_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("secret", SECRETS)
def test_compose_refuses_to_start_on_env_example_as_copied(secret: str) -> None:
    """`cp .env.example .env` and nothing else: compose names each secret still to set."""
    env = {**USER_ENV, secret: read_env_file(ENV_EXAMPLE)[secret]}
    assert env[secret] == ""
    with pytest.raises(KeyError, match=secret):
        interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), env)


@pytest.mark.parametrize("value", ["change-me-to-a-long-random-string", "change-me-too", "password", "short-but-real"])
def test_secrets_check_refuses_placeholders_and_everything_waits_for_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack's first service runs the real `corl secrets check` on the secrets compose hands it."""
    check = SERVICES["secrets-check"]
    (argv,) = service_argv(check)
    assert argv[:2] == ["secrets", "check"] and set(argv[2:]) == set(SECRETS)
    for name, v in check["environment"].items():
        monkeypatch.setenv(name, str(v))
    assert CliRunner().invoke(corl_app, argv).exit_code == 0  # the user's real secrets pass
    monkeypatch.setenv("CORL_REDIS_PASSWORD", value)
    result = CliRunner().invoke(corl_app, argv)
    assert result.exit_code == 1 and "CORL_REDIS_PASSWORD" in result.output
    for name in SERVICES:  # nothing starts before the check passed (directly or through a dependency)
        if name != "secrets-check":
            assert _waits_for(name, "secrets-check"), name


def _waits_for(service: str, first: str) -> bool:
    deps = SERVICES[service].get("depends_on") or {}
    return first in deps or any(_waits_for(d, first) for d in deps if d in SERVICES and d != service)


def test_each_service_gets_only_the_secrets_it_uses() -> None:
    for name, svc in SERVICES.items():
        env = svc.get("environment") or {}
        argv = service_argv(svc)[0] if str(svc.get("image", "")).startswith("corl:") else []
        if name.startswith("model-"):  # they run programs: no Redis password
            assert "CORL_REDIS_PASSWORD" not in env and env["CORL_COHORT_TOKEN"] == USER_ENV["CORL_COHORT_TOKEN"]
            assert env["CORL_TASKS"] == load_config(ROOT / "deploy" / "cohort.compose.yaml").task.name
        if argv[:1] == ["train"] or argv[:2] in (["serve", "aggregator"], ["serve", "evaluator"], ["serve", "gateway"]):
            assert env["CORL_REDIS_PASSWORD"] == USER_ENV["CORL_REDIS_PASSWORD"], name
    gateway = SERVICES["gateway"]["environment"]  # agents authenticate with the cohort token; no program runs
    assert gateway["CORL_COHORT_TOKEN"] == USER_ENV["CORL_COHORT_TOKEN"] and "CORL_SANDBOX_TOKEN" not in gateway
    for name in ("aggregator", "gateway", "prometheus", "grafana"):  # published on loopback only, unless told otherwise
        assert all(str(p).startswith("127.0.0.1:") for p in SERVICES[name]["ports"]), name


def test_every_member_has_a_server_per_profile_and_a_trainer() -> None:
    cfg = load_config(ROOT / "deploy" / "cohort.compose.yaml")
    assert len(cfg.members) == 4
    for m in cfg.members:
        cpu, gpu = SERVICES[f"model-{m.name}"], SERVICES[f"model-{m.name}-gpu"]
        assert cpu["profiles"] == ["cpu"] and gpu["profiles"] == ["gpu"]
        assert option_value(service_argv(cpu)[0], "--backend") == "transformers"
        assert option_value(service_argv(gpu)[0], "--backend") == "vllm"
        # The GPU variant answers on the same hostname, so the one cohort config fits both profiles.
        assert f"model-{m.name}" in gpu["networks"]["default"]["aliases"]
        devices = gpu["deploy"]["resources"]["reservations"]["devices"]
        assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        assert "deploy" not in cpu
        if m.role == "trained":
            assert option_value(service_argv(SERVICES[f"trainer-{m.name}"])[0], "--member") == m.name
    trainers = {n for n in SERVICES if n.startswith("trainer-")}
    assert trainers == {f"trainer-{m.name}" for m in cfg.members if m.role == "trained"}


def test_default_profile_is_cpu() -> None:
    assert read_env_file(ENV_EXAMPLE)["COMPOSE_PROFILES"] == "cpu"


def test_programs_run_only_in_the_sandbox_service_which_holds_nothing_and_reaches_nowhere() -> None:
    sandbox = SERVICES["sandbox"]
    assert service_argv(sandbox) == [["serve", "sandbox", "--host", "0.0.0.0", "--port", "8300"]]
    assert set(sandbox["environment"]) == {"CORL_SANDBOX_TOKEN", "HEALTHCHECK_URL"}  # no other secret
    assert "volumes" not in sandbox and "ports" not in sandbox
    assert sandbox["networks"] == ["sandbox"] and COMPOSE["networks"]["sandbox"]["internal"] is True
    assert sandbox["cap_drop"] == ["ALL"] and sandbox["read_only"] is True
    # Its jail's user namespaces and own /proc, for this container alone (measured live: compose_live).
    assert {"seccomp=unconfined", "systempaths=unconfined"} <= set(sandbox["security_opt"])
    assert all("security_opt" not in svc for name, svc in SERVICES.items() if name != "sandbox")
    clients = [n for n in SERVICES if n.startswith("model-")] + ["aggregator", "evaluator"]
    for name in clients:  # whoever may have to run a program sends it there, over that network
        env, nets = SERVICES[name]["environment"], SERVICES[name]["networks"]
        assert env["CORL_SANDBOX_URL"] == "http://sandbox:8300", name
        assert env["CORL_SANDBOX_TOKEN"] == sandbox["environment"]["CORL_SANDBOX_TOKEN"], name
        assert "sandbox" in nets and "default" in nets, name
    for name in SERVICES:  # and nobody else is on it
        if name not in (*clients, "sandbox"):
            assert "sandbox" not in (SERVICES[name].get("networks") or []), name


def test_redis_persists_with_aof_on_a_named_volume_behind_a_password() -> None:
    redis = SERVICES["redis"]
    script = " ".join(redis["command"])
    assert "--appendonly yes" in script and "--maxmemory-policy noeviction" in script
    # The password reaches Redis as a config file, never on its command line.
    assert "requirepass %s" in script and '"$CORL_REDIS_PASSWORD"' in script and "--requirepass" not in script
    assert any(v.split(":")[0] in COMPOSE["volumes"] and v.split(":")[1] == "/data" for v in redis["volumes"])
    assert "REDISCLI_AUTH" in " ".join(redis["healthcheck"]["test"])


def test_cohort_init_runs_once_and_everything_waits_for_it() -> None:
    init = SERVICES["cohort-init"]
    script = " ".join(init["command"])
    assert script.startswith("test -f /data/cohort/cohort.json ||"), "init must skip an existing cohort"
    assert service_argv(init) == [["cohort", "init", "--preset", "tiny", "--out", "/data/cohort"]]
    for name in CORL_SERVICES:
        if name in ("cohort-init", "secrets-check", "sandbox"):  # the sandbox needs no cohort
            continue
        deps = SERVICES[name]["depends_on"]
        assert deps["cohort-init"]["condition"] == "service_completed_successfully", name
        assert "healthcheck" in SERVICES[name], name
    for name in ("aggregator", "evaluator", *[n for n in SERVICES if n.startswith("trainer-")]):
        deps = SERVICES[name]["depends_on"]
        assert deps["redis"]["condition"] == "service_healthy"
        servers = [d for d in deps if d.startswith("model-")]
        assert servers and all(deps[d]["condition"] == "service_healthy" for d in servers), name
    assert SERVICES["evaluator"]["depends_on"]["aggregator"]["condition"] == "service_healthy"


@pytest.mark.parametrize(("service", "argv"), COMMANDS, ids=[f"{n}:{' '.join(a[:2])}" for n, a in COMMANDS])
def test_command_is_accepted_by_the_real_cli(service: str, argv: list[str]) -> None:
    """The command with --help appended: click parses every option (an unknown or renamed flag
    fails) before the eager --help exits."""
    result = CliRunner().invoke(corl_app, [*argv, "--help"])
    assert result.exit_code == 0, f"{service}: corl {' '.join(argv)}\n{result.output}"
    for flag in (a for a in argv if a.startswith("--")):
        assert flag in result.output, f"{service}: {flag} is not an option of `corl {' '.join(argv[:2])}`"
    _parse_with_the_real_cli(SERVICES[service], argv)


def _parse_with_the_real_cli(svc: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """Parse and convert every option value as the CLI does (``make_context`` runs types and
    checks but not the command; --help above skips them). Bind-mounted container paths are
    mapped back to the host files they come from."""
    args = [str(_bind_source(svc, a) or a) for a in argv]
    cmd: Any = typer.main.get_command(corl_app)
    ctx = cmd.context_class(cmd, info_name="corl")
    while hasattr(cmd, "get_command") and args and not args[0].startswith("-"):
        name = args.pop(0)
        cmd = cmd.get_command(ctx, name)
        assert cmd is not None, f"no command {name!r}"
        if hasattr(cmd, "get_command"):
            ctx = cmd.context_class(cmd, info_name=name, parent=ctx)
        else:
            return dict(cmd.make_context(name, args, parent=ctx).params)
    raise AssertionError(f"{argv} names no command")


SETTINGS_CASES = [(n, a) for n, a in COMMANDS if role_of(a)]


@pytest.mark.parametrize(("service", "argv"), SETTINGS_CASES, ids=[n for n, _ in SETTINGS_CASES])
def test_environment_builds_the_service_settings(
    service: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    role = role_of(argv)
    assert role is not None
    cls = settings_class(role)
    env = {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}
    bad = unknown_env(cls, env)
    assert not bad, f"{service}: {bad} are not settings of {role.settings_class} (silently ignored)"
    monkeypatch.chdir(tmp_path)  # no stray .env file
    for var in [v for v in os.environ if v.startswith("CORL_")]:
        monkeypatch.delenv(var)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    required = {name for name, f in cls.model_fields.items() if f.is_required()}
    # Required settings that the command passes as flags (e.g. the aggregator's --config).
    flags: dict[str, Any] = {n: option_value(argv, "--" + n.replace("_", "-")) for n in required}
    settings = cls(**{k: v for k, v in flags.items() if v is not None})
    if "admin_token" not in cls.model_fields:  # the evaluator only reads: it is given no token
        assert "CORL_ADMIN_TOKEN" not in env, f"{service} gets an admin token it has no use for"
        return
    token: Any = getattr(settings, "admin_token", None)
    if isinstance(token, SecretStr):
        token = token.get_secret_value()
    assert token == USER_ENV["CORL_ADMIN_TOKEN"], f"{service} does not get the admin token"


@pytest.mark.parametrize("service", [n for n, a in COMMANDS if "--config" in a])
def test_mounted_cohort_config_loads_and_matches_the_command(service: str) -> None:
    argv = service_argv(SERVICES[service])[0]
    path = option_value(argv, "--config")
    assert path is not None
    source = _bind_source(SERVICES[service], path)
    assert source is not None and source.is_file(), f"{service}: nothing mounted at {path}"
    cfg = load_config(source)
    redis_host = cfg.redis_url.split("://", 1)[1].split(":")[0]
    assert redis_host in SERVICES, f"redis_url points at {redis_host}, not a compose service"
    if "--member" in argv:
        assert cfg.member(option_value(argv, "--member") or "").role == "trained"
    for m in cfg.members:
        for url in m.servers:
            host, port = url.removeprefix("http://").split(":")
            server = service_argv(SERVICES[host])[0]
            assert option_value(server, "--name") == m.name
            assert option_value(server, "--model") == m.model
            assert option_value(server, "--port") == port
            assert option_value(server, "--host") == "0.0.0.0"
            # The task is set once, in the cohort config: a server has no task setting of its own.
            assert "CORL_TASK" not in SERVICES[host]["environment"]
            # A server loads weights only from the store its trainer publishes to, mounted there.
            assert SERVICES[host]["environment"]["CORL_WEIGHTS_ROOT"] == cfg.weights_dir
            assert any(str(v).split(":")[1:2] == [cfg.weights_dir] for v in SERVICES[host]["volumes"])


def test_prometheus_scrapes_every_service() -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    expected = {"aggregator:8100"}
    for name in CORL_SERVICES:
        argv = service_argv(SERVICES[name])[0]
        if argv[:2] in (["serve", "model"], ["serve", "evaluator"], ["serve", "gateway"]) and "-gpu" not in name:
            expected.add(f"{name}:{option_value(argv, '--port')}")
        elif argv[:1] == ["train"]:
            expected.add(f"{name}:{option_value(argv, '--metrics-port')}")
    assert expected <= targets, f"not scraped: {sorted(expected - targets)}"
    for job in prom["scrape_configs"]:
        for sc in job.get("static_configs", []):
            if job["job_name"] in ("corl-model", "corl-trainer"):
                host = sc["targets"][0].split(":")[0]
                assert sc["labels"]["member"] == host.split("-", 1)[1]


def test_grafana_is_provisioned_with_the_chart_dashboard() -> None:
    grafana = SERVICES["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    prov = ROOT / mounts["/etc/grafana/provisioning"]
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((prov / "dashboards" / "corl.yml").read_text())["providers"][0]
    dash_dir = next(src for dst, src in mounts.items() if dst.startswith(provider["options"]["path"]))
    assert (ROOT / dash_dir / "corl.json").is_file()


def test_trackers_get_their_keys_from_env_and_a_volume_for_their_files() -> None:
    cfg = load_config(ROOT / "deploy" / "cohort.compose.yaml")
    assert cfg.tracking.report_to == [] and cfg.tracking.dir == "/data/tracking"  # off until the user names one
    env = {**USER_ENV, "WANDB_API_KEY": "wandb-key", "MLFLOW_TRACKING_URI": "http://mlflow:5000"}
    services = load_compose(env)["services"]
    for name in ("aggregator", "evaluator", *(n for n in services if n.startswith("trainer-"))):
        svc = services[name]
        assert svc["environment"]["WANDB_API_KEY"] == "wandb-key", name
        assert svc["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000", name
        assert f"tracking:{cfg.tracking.dir}" in svc["volumes"], f"{name}: nowhere to write event files"
    assert "tracking" in COMPOSE["volumes"]
    assert all("WANDB_API_KEY" not in (s.get("environment") or {}) for n, s in services.items() if "model-" in n)
