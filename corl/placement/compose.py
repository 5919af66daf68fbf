"""docker-compose.yml's ``gpu`` profile, placed by the device plan: an override file that gives each
model server (``model-<member>-gpu``) and each trainer on GPUs (``trainer-<member>``) its devices.

    corl plan --config deploy/cohort.compose.yaml --gpus 4 --compose docker-compose.gpu.yml
    docker compose -f docker-compose.yml -f docker-compose.gpu.yml --profile gpu up -d

Compose appends sequences when it merges files, so the device lists are tagged ``!override``
(compose's own tag: the list replaces the one of docker-compose.yml). A container sees only its
reserved devices, numbered from 0, so no ``CUDA_VISIBLE_DEVICES`` is needed inside it.
"""

from __future__ import annotations

from typing import Any

import yaml

from corl.config import CohortConfig

from .plan import Plan, plan

GPU_IMAGE: dict[str, Any] = {
    "image": "${CORL_GPU_IMAGE:-corl:gpu}",
    "build": {"context": ".", "dockerfile": "docker/Dockerfile", "args": {"VARIANT": "gpu"}},
}
CONFIG = "/etc/corl/cohort.yaml"  # where compose mounts the cohort config
METRICS_PORT = "9100"


class Override(list):  # type: ignore[type-arg]
    """A sequence compose must replace, not append to, when it merges the override (``!override``)."""


def _devices(ids: tuple[str, ...]) -> dict[str, Any]:
    devices = Override([{"driver": "nvidia", "device_ids": list(ids), "capabilities": ["gpu"]}])
    return {"resources": {"reservations": {"devices": devices}}}


def gpu_profile_plan(cfg: CohortConfig, devices: list[str]) -> Plan:
    """The plan of the ``gpu`` profile, whose servers all run vLLM whatever the config's backend says."""
    members = [m.model_copy(update={"backend": "vllm"}) if m.endpoint is None else m for m in cfg.members]
    return plan(cfg.model_copy(update={"members": members}), devices)


def compose_override(p: Plan) -> dict[str, Any]:
    """The services section of the override for plan ``p`` (of ``gpu_profile_plan``)."""
    services: dict[str, Any] = {}
    for s in p.slots:
        if not s.devices:
            continue
        if s.role == "server":
            env = {"CORL_VLLM__TENSOR_PARALLEL_SIZE": str(s.tensor_parallel)}
            if s.memory_share is not None:
                env["CORL_VLLM__GPU_MEMORY_UTILIZATION"] = str(s.memory_share)
            services[f"model-{s.member}-gpu"] = {"environment": env, "deploy": _devices(s.devices)}
            continue
        train = ["train", "--config", CONFIG, "--member", s.member, "--metrics-port", METRICS_PORT]
        service: dict[str, Any] = {**GPU_IMAGE, "deploy": _devices(s.devices)}
        if s.processes > 1:  # the image's entrypoint is corl; a group starts under torchrun (the chart's args)
            service["entrypoint"] = ["tini", "--", "python", "-m", "torch.distributed.run"]
            service["command"] = [
                "--standalone", "--nnodes", "1", "--nproc-per-node", str(s.processes), "--max-restarts", "0",
                "-m", "corl", *train,
            ]  # fmt: skip
        services[f"trainer-{s.member}"] = service
    return {"services": services}


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # each service written out in full, no &id anchors


def _override(dumper: yaml.SafeDumper, data: Override) -> yaml.Node:
    return dumper.represent_sequence("!override", list(data))


_Dumper.add_representer(Override, _override)


def dump_override(override: dict[str, Any], header: str) -> str:
    """The override as YAML, ``header`` (lines) first as comments."""
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    return comments + yaml.dump(override, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=120)
