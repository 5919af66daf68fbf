"""`docker compose up`, for real: the default (CPU) profile of docker-compose.yml under a container
engine, trained for a few rounds, a model server killed, the stack taken down and brought back on
its volumes, then removed. Deselected from plain `pytest`; CI runs `pytest -m compose_live` after
`.ci/container_engine.sh` (podman, the offline base and the Redis/Prometheus images).

The tests share one stack and run in file order: each phase starts from where the previous one
left it. Times of every phase are printed and saved to .cache/compose_live/timings.json.
CORL_COMPOSE_COHORT=<dir of a built tiny cohort> seeds the cohort volume (cohort-init then skips);
CORL_COMPOSE_KEEP=1 leaves the stack up after the tests.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corl.config import load_config

from .live_stack import (
    GRAFANA_IMAGE,
    OFFLINE_BASE,
    OFFLINE_IMAGES,
    LiveStack,
    build_cpu_image,
    engine_binaries,
    free_port,
    image_exists,
    make_env_file,
    metric,
    metrics,
    run,
    wait_for,
)
from .support import ROOT

pytestmark = [pytest.mark.compose_live, pytest.mark.timeout(3600)]

MEMBERS = [m.name for m in load_config(ROOT / "deploy" / "cohort.compose.yaml").members]
TRAINED = [m.name for m in load_config(ROOT / "deploy" / "cohort.compose.yaml").members if m.role == "trained"]
SERVICES = [
    "redis",
    "prometheus",
    *[f"model-{m}" for m in MEMBERS],
    *[f"trainer-{m}" for m in TRAINED],
    "aggregator",
    "evaluator",
    "sandbox",
]
IMAGE = os.environ.get("CORL_IMAGE", "corl:cpu")
TIMINGS = ROOT / ".cache" / "compose_live" / "timings.json"
MIN_ROUNDS, MIN_VERSIONS = 5, 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    found = engine_binaries()
    if found is None:
        pytest.fail("no container engine: run `bash .ci/container_engine.sh` (podman + podman-compose)")
    engine, compose_cmd = found
    offline = engine == "podman" and all(image_exists(engine, i) for i in (OFFLINE_BASE, *OFFLINE_IMAGES))
    env_file = tmp_path_factory.mktemp("compose") / ".env"
    env = make_env_file(env_file, free_port(), free_port(), free_port())
    s = LiveStack(
        engine,
        compose_cmd,
        os.environ.get("CORL_COMPOSE_PROJECT", "corl"),
        env_file,
        offline,
        env={"COMPOSE_PROFILES": env["COMPOSE_PROFILES"], "CORL_IMAGE": IMAGE},
    )
    s.env_values = env
    s.compose("down", "-v", "--remove-orphans", check=False)  # a previous run's leftovers
    seed = os.environ.get("CORL_COMPOSE_COHORT")
    t0 = time.monotonic()
    try:
        with s.phase("build image"):
            build_cpu_image(engine, IMAGE)
        if seed:
            s.seed_cohort(Path(seed))
        s.tick_health()
        # `up` returns once cohort-init has finished (the servers wait for it to complete).
        with s.phase("up + every health check" + (" (cohort seeded)" if seed else " (cohort-init builds the cohort)")):
            s.up()
            s.wait_all_healthy(SERVICES, timeout_s=900)
        yield s
    finally:
        s.stop_ticking()
        if os.environ.get("CORL_COMPOSE_KEEP") != "1":
            s.compose("down", "-v", "--remove-orphans", check=False)
        s.timings["total"] = round(time.monotonic() - t0, 1)
        TIMINGS.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS.write_text(json.dumps(s.timings, indent=2) + "\n")
        print("[compose_live] phase times (s): " + json.dumps(s.timings), flush=True)


def _training_progress(s: LiveStack) -> tuple[int, dict[str, float], dict[str, int]]:
    """(rounds committed, weight versions published per trainer, hot swaps per server)."""
    publishes = {m: s.trainer(m)["corl_trainer_publishes_total"] for m in TRAINED}
    return s.rounds_ok(), publishes, {m: s.server_swaps(m) for m in MEMBERS}


def test_cohort_init_ran_once_and_exited_cleanly(stack: LiveStack) -> None:
    rows = [
        r
        for r in stack.containers(all_states=True)
        if (r.get("Labels") or {}).get("com.docker.compose.service") == "cohort-init"
    ]
    assert len(rows) == 1 and rows[0].get("ExitCode", 0) == 0, rows
    assert (stack.volume_dir("cohort") / "cohort.json").is_file()


def test_rounds_commit_and_every_member_trains_publishes_and_swaps(stack: LiveStack) -> None:
    def enough() -> bool:
        rounds, publishes, swaps = _training_progress(stack)
        if rounds < MIN_ROUNDS or min(publishes.values()) < MIN_VERSIONS or min(swaps.values()) < MIN_VERSIONS:
            raise AssertionError(f"rounds {rounds}, publishes {publishes}, swaps {swaps}")
        return True

    with stack.phase(f"train to {MIN_ROUNDS} rounds, {MIN_VERSIONS} versions each"):
        wait_for("rounds, publishes and swaps", enough, timeout_s=600, interval_s=5)
    for m in TRAINED:
        assert stack.server_version(m) >= MIN_VERSIONS, m
    # What the README tells a user to look at, through the published host port.
    port = stack.env_values["CORL_AGGREGATOR_HOST_PORT"]
    stats = httpx.get(f"http://127.0.0.1:{port}/v1/runs/compose/stats", timeout=10).json()
    assert stats["next_round"] >= MIN_ROUNDS and stats["rounds"], stats


def test_dashboard_shows_every_members_held_out_accuracy_as_a_number(stack: LiveStack) -> None:
    """The evaluator reads each member through its server (the first reading at start) into Redis; the
    aggregator's dashboard and stats show it, through the published port, as a number, not "-"."""
    base = f"http://127.0.0.1:{stack.env_values['CORL_AGGREGATOR_HOST_PORT']}/v1/runs/compose"

    def every_member_read() -> dict[str, tuple[float, int]]:
        view = httpx.get(f"{base}/dashboard", timeout=10).json()
        shown = {m["name"]: (m["heldout_accuracy"], m["heldout_version"]) for m in view["members"]}
        if set(shown) != set(MEMBERS) or any(not isinstance(acc, float | int) for acc, _ in shown.values()):
            raise AssertionError(f"held-out accuracy on the dashboard: {shown}")
        return shown

    with stack.phase("held-out accuracy of every member on the dashboard"):
        shown = wait_for("a held-out reading of every member", every_member_read, timeout_s=420, interval_s=5)
    assert all(0.0 <= acc <= 1.0 and isinstance(version, int) for acc, version in shown.values()), shown
    # The same readings in the stats and the evaluator's gauges (or newer ones: weights move on).
    stats = httpx.get(f"{base}/stats", params={"last": 1}, timeout=10).json()
    page = metrics(stack.url("evaluator", 8200, "/metrics"))
    for m, (_, version) in shown.items():
        assert 0.0 <= stats["heldout"][m]["accuracy"] <= 1.0 and stats["heldout"][m]["weight_version"] >= version
        assert metric(page, "corl_evaluator_heldout_accuracy_ratio", member=m) is not None, m
        assert (metric(page, "corl_evaluator_heldout_weight_version", member=m) or 0) >= version, m


def test_prometheus_scrapes_every_corl_target(stack: LiveStack) -> None:
    port = stack.env_values["PROMETHEUS_HOST_PORT"]

    def all_up() -> bool:
        targets = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        corl = {t["labels"]["instance"]: t["health"] for t in targets if t["labels"]["job"].startswith("corl-")}
        expected = {f"model-{m}:8000" for m in MEMBERS} | {f"trainer-{m}:9100" for m in TRAINED}
        expected |= {"aggregator:8100", "evaluator:8200", "gateway:8400"}
        if set(corl) != expected or any(h != "up" for h in corl.values()):
            raise AssertionError(corl)
        return True

    with stack.phase("prometheus targets up"):
        wait_for("every corl target up in Prometheus", all_up, timeout_s=120, interval_s=5)

    # The scraped series are corl's own: queries over the aggregator's round gauge and the evaluator's
    # held-out accuracy (the Grafana panel's) answer.
    def query(q: str) -> list[Any]:
        reply = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": q}, timeout=10)
        return list(reply.json()["data"]["result"])

    for q in ("corl_aggregator_round", "corl_evaluator_heldout_accuracy_ratio"):
        assert wait_for(f"{q} in Prometheus", lambda q=q: query(q), timeout_s=60), q


def test_grafana_serves_the_provisioned_dashboard(stack: LiveStack) -> None:
    if stack.offline and not image_exists(stack.engine, GRAFANA_IMAGE):
        pytest.skip(
            f"{GRAFANA_IMAGE} cannot be pulled here (no Docker Hub) and Grafana has no Debian package; "
            "the offline override leaves Grafana out"
        )
    env = stack.env_values
    auth = (env["GRAFANA_ADMIN_USER"], env["GRAFANA_ADMIN_PASSWORD"])
    base = f"http://127.0.0.1:{env['GRAFANA_HOST_PORT']}"
    found = wait_for(
        "the corl dashboard in Grafana",
        lambda: httpx.get(f"{base}/api/search", params={"query": "corl"}, auth=auth, timeout=10).json(),
        timeout_s=180,
    )
    uid = found[0]["uid"]
    dash = httpx.get(f"{base}/api/dashboards/uid/{uid}", auth=auth, timeout=10).json()["dashboard"]
    assert dash["panels"]


def test_tokens_and_the_redis_password_are_in_force(stack: LiveStack) -> None:
    env = stack.env_values
    generate = stack.url(f"model-{MEMBERS[0]}", 8000, "/v1/generate")
    body = {"prompts": ["1+1="], "n": 1, "max_tokens": 2}
    assert httpx.post(generate, json=body, timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {env['CORL_COHORT_TOKEN']}"}
    assert httpx.post(generate, json=body, headers=auth, timeout=60).status_code == 200
    grade = stack.url(f"model-{MEMBERS[0]}", 8000, "/v1/grade")
    code = {"task": "code", "items": [{"prompt": "p", "response": "r"}], "mode": "vote", "n_votes": 1}
    assert httpx.post(grade, json=code, headers=auth, timeout=30).status_code == 403  # not the run's task
    redis = stack.container_of("redis")
    forge = ["redis-cli", "XADD", "corl:compose:forged", "*", "k", "v"]
    stranger = run([stack.engine, "exec", redis, *forge], check=False)
    assert "NOAUTH" in stranger.stdout + stranger.stderr
    owner = run([stack.engine, "exec", "-e", f"REDISCLI_AUTH={env['CORL_REDIS_PASSWORD']}", redis, "redis-cli", "ping"])
    assert owner.stdout.strip() == "PONG"


def _sandbox_probe(argv: list[str]) -> dict[str, Any]:
    out = run(argv, timeout=300, input=(Path(__file__).parent / "sandbox_probe.py").read_text())
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.security
def test_the_sandbox_holds_in_the_stack_and_refuses_under_a_seccomp_profile(stack: LiveStack) -> None:
    """The attack suite's programs through corl's sandbox: in the sandbox service's container (its own
    jail, its token in the environment), from a model server's container (whose programs go to the
    sandbox service: its secrets never reach them), and in the image under a seccomp profile that
    refuses user namespaces as Docker's and Kubernetes' defaults do (refused, fail closed)."""
    engine = stack.engine
    jailed = _sandbox_probe([engine, "exec", "-i", stack.container_of("sandbox"), "python", "-"])
    print(f"[compose_live] sandbox service's own jail: {jailed}", flush=True)
    assert jailed.get("escaped") == [] and jailed["protections"]["isolation"].startswith("bwrap"), jailed
    server = _sandbox_probe([engine, "exec", "-i", stack.container_of(f"model-{MEMBERS[0]}"), "python", "-"])
    print(f"[compose_live] from a model server, through the sandbox service: {server}", flush=True)
    assert server.get("escaped") == [], server
    profile = Path(__file__).parent / "seccomp-no-userns.json"
    seccomp = _sandbox_probe(
        [engine, "run", "--rm", "-i", "--security-opt", f"seccomp={profile}", "--entrypoint", "python",
         "-e", "CORL_ADMIN_TOKEN=canary-" + os.urandom(8).hex(), IMAGE, "-"]
    )  # fmt: skip
    print(f"[compose_live] the image under the no-userns seccomp profile: {seccomp}", flush=True)
    assert "refusing to run untrusted code" in seccomp.get("refused", "") or seccomp.get("escaped") == [], seccomp


def test_placeholder_secrets_refuse_to_start(stack: LiveStack) -> None:
    env = ["-e", "CORL_ADMIN_TOKEN=change-me-to-a-long-random-string", "-e", "CORL_COHORT_TOKEN=short"]
    out = run([stack.engine, "run", "--rm", *env, IMAGE, "secrets", "check", "CORL_ADMIN_TOKEN", "CORL_COHORT_TOKEN"],
              timeout=120, check=False)  # fmt: skip
    assert out.returncode == 1 and "CORL_ADMIN_TOKEN: a placeholder" in out.stderr, out.stderr


def test_killed_model_server_is_restarted_on_the_newest_weights(stack: LiveStack) -> None:
    member = TRAINED[0]
    service = f"model-{member}"
    container = stack.container_of(service)
    before = stack.inspect(container)
    round_at_kill = stack.aggregator_round()
    with stack.phase(f"kill {service} -> back on newest weights"):
        # SIGKILL the container's main process from the host: a crash, not a `stop` (which
        # `unless-stopped` would honour).
        os.kill(int(before["State"]["Pid"]), signal.SIGKILL)
        wait_for(
            f"{service} restarted",
            lambda: (
                stack.inspect(container)["State"]["Pid"] not in (0, before["State"]["Pid"])
                and stack.inspect(container)["State"]["Status"] == "running"
            ),
            timeout_s=120,
            interval_s=2,
        )
        restarts = stack.inspect(container).get("RestartCount", 0)
        assert restarts >= 1 or stack.inspect(container)["State"]["StartedAt"] != before["State"]["StartedAt"]
        stack.wait_all_healthy([service], timeout_s=300)

        def caught_up() -> bool:
            newest = stack.trainer(member)["corl_trainer_weight_version"]
            serving = stack.server_version(member)
            if serving < newest or serving == 0:
                raise AssertionError(f"serving {serving}, newest published {newest}")
            return True

        wait_for(f"{service} back on the newest weights", caught_up, timeout_s=300, interval_s=5)
        wait_for("rounds after the restart", lambda: stack.aggregator_round() >= round_at_kill + 2, timeout_s=300)


def test_down_then_up_resumes_rounds_and_checkpoints(stack: LiveStack) -> None:
    wait_for("a checkpoint per trainer", lambda: all(stack.checkpoint_state(m) for m in TRAINED), timeout_s=300)
    round_before = stack.aggregator_round()
    steps_before = {m: stack.trainer(m)["corl_trainer_step"] for m in TRAINED}
    with stack.phase("down (volumes kept)"):
        stack.compose("down", timeout=300)
    assert not stack.containers(all_states=True), "down left containers"
    saved = {m: stack.checkpoint_state(m) for m in TRAINED}
    for m, st in saved.items():
        assert st is not None, m
        # A clean stop checkpoints what was applied: nothing durable is lost.
        assert st["step"] >= steps_before[m], (m, st["step"], steps_before[m])
        assert len(st["applied"]) == len(set(st["applied"])), f"{m}: a batch id applied twice"

    with stack.phase("up again + every health check"):
        stack.up()
        stack.wait_all_healthy(SERVICES, timeout_s=600)
    # Resumed, not restarted: the round counter and the trainers' steps continue from the volumes.
    assert stack.aggregator_round() >= round_before
    for m in TRAINED:
        t = stack.trainer(m)
        assert t["corl_trainer_step"] >= saved[m]["step"], (m, t, saved[m]["step"])  # type: ignore[index]

    with stack.phase("rounds continue after up"):
        wait_for("new rounds after up", lambda: stack.aggregator_round() >= round_before + 2, timeout_s=400)
        wait_for(
            "every trainer applies new batches",
            lambda: all(stack.trainer(m)["corl_trainer_step"] > saved[m]["step"] for m in TRAINED),  # type: ignore[index]
            timeout_s=400,
        )
    # Nothing trained twice: the applied ids continue the saved ones, each once.
    stack.compose("stop", timeout=300)
    for m in TRAINED:
        after = stack.checkpoint_state(m)
        assert after is not None
        ids = after["applied"]
        assert len(ids) == len(set(ids)), f"{m}: a batch trained twice"
        old = saved[m]["applied"]  # type: ignore[index]
        kept = [b for b in ids if b in set(old)]
        assert kept == old[len(old) - len(kept) :], f"{m}: applied ids do not continue the checkpoint"
        assert after["step"] > saved[m]["step"]  # type: ignore[index]


def test_down_with_volumes_leaves_nothing(stack: LiveStack) -> None:
    with stack.phase("down -v"):
        stack.compose("down", "-v", "--remove-orphans", timeout=300)
    assert not stack.containers(all_states=True)
    vols = run([stack.engine, "volume", "ls", "--format", "{{.Name}}"], timeout=60).stdout.split()
    assert not [v for v in vols if v.startswith(f"{stack.project}_")], vols
    nets = run([stack.engine, "network", "ls", "--format", "{{.Name}}"], timeout=60).stdout.split()
    assert not [n for n in nets if n.startswith(f"{stack.project}_")], nets
    Path(stack.env_file).unlink(missing_ok=True)
