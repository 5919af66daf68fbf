"""docker-compose.yml's gpu profile placed by the device plan: ``corl plan --compose`` writes an override
that gives each server and each trainer of the compose cohort the GPUs ``corl run`` would give them,
on nodes of 1, 2, 4 and 8 GPUs, replacing (not appending to) the profile's own device list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from corl.cli import app
from corl.config import load_config
from corl.placement.compose import gpu_profile_plan

from .support import ROOT, load_compose

COHORT = ROOT / "deploy" / "cohort.compose.yaml"
SERVICES = load_compose()["services"]


class _Loader(yaml.SafeLoader):
    pass


class Replace(list):  # type: ignore[type-arg]
    """A sequence tagged !override: compose replaces the base file's with it."""


_Loader.add_constructor("!override", lambda loader, node: Replace(loader.construct_sequence(node, deep=True)))


def _merge(base: Any, override: Any) -> Any:
    """Compose's merge: mappings merge, sequences append, a !override sequence replaces."""
    if isinstance(override, Replace):
        return list(override)
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in override.items()}}
    if isinstance(base, list) and isinstance(override, list):
        return base + override
    return override


def _override(tmp_path: Path, config: Path, gpus: int) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "docker-compose.gpu.yml"
    res = CliRunner().invoke(
        app, ["plan", "--config", str(config), "--gpus", str(gpus), "--compose", str(out)], env={"COLUMNS": "200"}
    )
    data = yaml.load(out.read_text(), Loader=_Loader) if out.exists() else {}  # noqa: S506 - SafeLoader subclass
    return res.exit_code, res.output, data


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_the_override_places_every_server_and_trainer_as_the_plan_does(gpus: int, tmp_path: Path) -> None:
    code, output, override = _override(tmp_path, COHORT, gpus)
    assert code == 0, output
    p = gpu_profile_plan(load_config(COHORT), [str(i) for i in range(gpus)])
    assert set(override["services"]) <= set(SERVICES), "the override names only services of docker-compose.yml"
    for s in p.slots:
        name = f"model-{s.member}-gpu" if s.role == "server" else f"trainer-{s.member}"
        svc = _merge(SERVICES[name], override["services"].get(name, {}))
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if not s.devices:  # a trainer left on the CPU keeps the CPU image and no device
            assert s.role == "trainer" and not devices and svc["image"].startswith("${CORL_IMAGE")
            continue
        assert devices == [{"driver": "nvidia", "device_ids": list(s.devices), "capabilities": ["gpu"]}], name
        if s.role == "server":
            assert svc["environment"]["CORL_VLLM__GPU_MEMORY_UTILIZATION"] == str(s.memory_share)
            assert svc["environment"]["CORL_VLLM__TENSOR_PARALLEL_SIZE"] == "1"
        else:
            assert svc["image"] == "${CORL_GPU_IMAGE:-corl:gpu}" and svc["build"]["args"] == {"VARIANT": "gpu"}
    used = {d for s in p.slots for d in s.devices}
    assert used == {str(i) for i in range(gpus)}, "the compose cohort (4 members) spreads over every GPU"


def test_members_asking_for_gpus_get_tensor_parallel_servers_and_trainer_groups(tmp_path: Path) -> None:
    data = yaml.safe_load(COHORT.read_text())
    data["members"][0].update(gpus=2, backend="vllm")  # gpt2 served over 2 GPUs, trained by a group of 2
    data["members"][1]["trainer"] = {"gpus": 0}  # mamba's trainer stays on the CPU
    data["placement"] = {"colocate": True}
    config = tmp_path / "cohort.yaml"
    config.write_text(yaml.safe_dump(data))
    code, output, override = _override(tmp_path, config, 4)
    assert code == 0, output
    gpt2, trainer = override["services"]["model-gpt2-gpu"], override["services"]["trainer-gpt2"]
    assert gpt2["environment"]["CORL_VLLM__TENSOR_PARALLEL_SIZE"] == "2"
    assert gpt2["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0", "1"]
    assert trainer["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0", "1"]
    assert trainer["entrypoint"][-3:] == ["python", "-m", "torch.distributed.run"]
    cmd = trainer["command"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and cmd[cmd.index("-m") + 1 :][:2] == ["corl", "train"]
    assert "trainer-mamba" not in override["services"]


def test_a_plan_that_does_not_fit_writes_no_override(tmp_path: Path) -> None:
    data = yaml.safe_load(COHORT.read_text())
    for m in data["members"]:
        m["gpus"] = 1
    config = tmp_path / "cohort.yaml"
    config.write_text(yaml.safe_dump(data))
    code, output, override = _override(tmp_path, config, 4)
    assert code == 2 and "the plan needs 8 GPUs; the node has 4" in output and override == {}
