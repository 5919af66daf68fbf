"""Starting a run's children: every member's model servers, the trainers and the aggregator, each on
the devices the run's device plan gives it (``corl.placement``), with its threads, limits and engine
options; ``corl run`` and ``corl eval`` start theirs here."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from corl.config import CohortConfig, dump_config
from corl.placement import Plan
from corl.redis_server import free_port
from corl.services.model.settings import engine_env

from .processes import ProcessGroup, corl_command, trainer_group_command
from .resume import CONFIG_FILE


def thread_env(cfg: CohortConfig, variable: str, trainers: bool = True) -> dict[str, str]:
    """torch threads for one compute process: the cores this process may use, shared among every
    server (and, with ``trainers``, every trainer) of the run, at least 1. Each would otherwise start
    one thread per core, and on a small machine real models then spend their time in contended thread
    pools (a 2-core round of the smol cohort took minutes instead of seconds). User-set variables win."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    processes = sum(len(m.servers) for m in cfg.members)
    processes += sum(m.trainer_processes for m in cfg.members if m.role == "trained") if trainers else 0
    n = str(max(1, cores // max(1, processes)))
    return {k: os.environ.get(k, n) for k in (variable, "OMP_NUM_THREADS")}


def start_model_servers(
    cfg: CohortConfig, group: ProcessGroup, trainers: bool = True, placement: Plan | None = None
) -> None:
    """Start every member's servers (on the ports of their loopback URLs, with the member's backend, on
    the devices ``placement`` gives each) and wait until they are ready. Their request time limit and
    token bound follow the config's rounds (long real-model generations); ``trainers``: the run's
    trainers will share the cores with them."""
    sampling = cfg.sampling()
    env = {
        "CORL_REQUEST_TIMEOUT_S": str(cfg.rounds.request_timeout_s),
        "CORL_MAX_TOKENS": str(max(256, sampling.max_tokens)),
        **thread_env(cfg, "CORL_NUM_THREADS", trainers),
    }
    for m in cfg.served_members():
        for i, url in enumerate(m.servers):
            port = url.rsplit(":", 1)[1]
            name = f"server-{m.name}-{i}"
            devices = placement.env(name) if placement else {}
            vllm = {**m.vllm.model_dump(exclude_none=True), **(placement.vllm_options(name) if placement else {})}
            group.start(
                name,
                corl_command(
                    "serve",
                    "model",
                    "--model",
                    m.model_path(),
                    "--name",
                    m.name,
                    "--port",
                    port,
                    "--weights-root",
                    cfg.weights_dir,
                    "--backend",
                    m.backend,
                ),  # fmt: skip
                health_url=f"{url}/readyz",
                env={**env, **(engine_env(vllm) if m.backend == "vllm" else {}), **devices},
            )
    group.wait_healthy()


def start_services(
    cfg: CohortConfig,
    run_dir: Path,
    group: ProcessGroup,
    aggregator_port: int,
    before_rounds: Callable[[], None] = lambda: None,
    before_aggregator: Callable[[], None] = lambda: None,
    placement: Plan | None = None,
) -> str:
    """Start every server (and the gateway, when the config has one), call ``before_rounds`` (the start
    reading: nothing has trained yet), start
    the trainers (each brings its member's servers to the newest published version), call
    ``before_aggregator`` (a resumed run's trainers catch up there), then start the aggregator, which
    samples the rounds; return its URL. Servers and trainers see the devices ``placement`` gives them."""
    config_path = run_dir / CONFIG_FILE
    dump_config(cfg, config_path)
    start_model_servers(cfg, group, placement=placement)
    if cfg.gateway.url:  # agents may send traffic (and harvest prompts) from now on
        port = cfg.gateway.url.rsplit(":", 1)[1]
        group.start(
            "gateway",
            corl_command("serve", "gateway", "--config", str(config_path), "--port", port),
            health_url=f"{cfg.gateway.url}/readyz",
        )
    before_rounds()
    for m in cfg.members:
        if m.role == "trained":
            metrics_port = free_port()
            devices = placement.env(f"trainer-{m.name}") if placement else {}
            args = ("train", "--config", str(config_path), "--member", m.name, "--metrics-port", str(metrics_port))
            group.start(
                f"trainer-{m.name}",
                trainer_group_command(m.trainer_processes, *args) if m.trainer_processes > 1 else corl_command(*args),
                health_url=f"http://127.0.0.1:{metrics_port}/metrics",  # served once the trainer is ready
                env={**thread_env(cfg, "CORL_TRAINER_THREADS"), **devices},
            )
    group.wait_healthy()
    before_aggregator()
    agg_url = f"http://127.0.0.1:{aggregator_port}"
    group.start(
        "aggregator",
        corl_command("serve", "aggregator", "--config", str(config_path), "--port", str(aggregator_port)),
        health_url=f"{agg_url}/readyz",
    )
    group.wait_healthy()
    return agg_url
