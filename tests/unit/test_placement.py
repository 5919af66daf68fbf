"""The device plan of one node (``corl plan``; ``corl run`` follows it): for cohorts of 2-4 members
asking for GPUs (``gpus:``, ``trainer.gpus``, vLLM tensor parallelism) or not, with and without
``placement.colocate``, on nodes of 0, 1, 2, 4 and 8 GPUs: each child's ``CUDA_VISIBLE_DEVICES``, a
vLLM server's tensor-parallel size and memory share, a trainer group's ranks, and a refusal that
says what to change when the run needs more GPUs than the node has. No GPU is needed: the plan is
pure, and the environment each child would get is read from what ``corl run`` starts."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corl.cli import app
from corl.config import ConfigError, parse_config
from corl.embedded.start import start_services
from corl.placement import NodeError, node_devices, plan
from corl.placement.node import gpu_count, visible


def _member(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "model": f"/models/{name}", "servers": [f"http://127.0.0.1:{8000 + len(name)}"], **kw}


def _cfg(*members: dict[str, Any], colocate: bool = False) -> Any:
    return parse_config({"members": list(members), "placement": {"colocate": colocate}})


def _node(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def _devices(p: Any) -> dict[str, str]:
    """process -> its CUDA_VISIBLE_DEVICES, as the plan gives it to the child."""
    return {s.process: p.env(s.process).get("CUDA_VISIBLE_DEVICES", "<unset>") for s in p.slots}


TWO_ONE_GPU = (_member("a", gpus=1), _member("b", gpus=1))
THREE_VLLM = (
    _member("a", gpus=2, backend="vllm"),
    _member("b", gpus=2, backend="vllm"),
    _member("c", gpus=1, backend="vllm", role="frozen"),
)
FOUR_AUTO = tuple(_member(n) for n in ("gpt2", "mamba", "llama", "qwen2"))


@pytest.mark.parametrize(
    ("members", "colocate", "gpus", "expected"),
    [
        # Two members, one GPU each for the server and one for the trainer: 4 GPUs.
        (TWO_ONE_GPU, False, 4, {"server-a-0": "0", "server-b-0": "2", "trainer-a": "1", "trainer-b": "3"}),
        (TWO_ONE_GPU, False, 8, {"server-a-0": "0", "server-b-0": "2", "trainer-a": "1", "trainer-b": "3"}),
        # Colocated: each trainer on its server's GPU, 2 GPUs.
        (TWO_ONE_GPU, True, 2, {"server-a-0": "0", "trainer-a": "0", "server-b-0": "1", "trainer-b": "1"}),
        (TWO_ONE_GPU, True, 8, {"server-a-0": "0", "trainer-a": "0", "server-b-0": "1", "trainer-b": "1"}),
        # vLLM tensor parallel 2 and trainer groups of 2; a frozen member has no trainer.
        (THREE_VLLM[:2], False, 8, {"server-a-0": "0,1", "trainer-a": "2,3", "server-b-0": "4,5", "trainer-b": "6,7"}),
        (
            THREE_VLLM,
            True,
            8,
            {"server-a-0": "0,1", "trainer-a": "0,1", "server-b-0": "2,3", "trainer-b": "2,3", "server-c-0": "4"},
        ),
        # Nothing asked: the planner spreads the tiny cohort over what the node has.
        (FOUR_AUTO, False, 8, {f"server-{n}-0": str(2 * i) for i, n in enumerate(("gpt2", "mamba", "llama", "qwen2"))}),
        (FOUR_AUTO, False, 2, {**{f"server-{n}-0": "0" for n in ("gpt2", "llama")}, "trainer-gpt2": "1"}),
        (FOUR_AUTO, False, 1, {**{f"server-{n}-0": "0" for n in ("gpt2", "qwen2")}, "trainer-qwen2": "0"}),
        (FOUR_AUTO, True, 4, {"server-gpt2-0": "0", "trainer-gpt2": "0", "server-qwen2-0": "3", "trainer-qwen2": "3"}),
        (FOUR_AUTO, True, 2, {"server-gpt2-0": "0", "trainer-mamba": "1", "server-llama-0": "0", "trainer-qwen2": "1"}),
    ],
)
def test_each_child_sees_its_planned_devices(
    members: tuple[dict[str, Any], ...], colocate: bool, gpus: int, expected: dict[str, str]
) -> None:
    p = plan(_cfg(*members, colocate=colocate), _node(gpus))
    assert p.fits, p.problems
    got = _devices(p)
    assert {k: got[k] for k in expected} == expected
    # No GPU is given to two processes unless they share on purpose (colocated, or the planner ran short).
    asked = [s for s in p.slots if s.asked]
    for s in asked:
        if not colocate:
            assert not s.shared_with, (s.process, s.shared_with)


def test_the_frozen_member_below_its_peers_is_on_the_cpu_when_it_asks_for_none() -> None:
    p = plan(_cfg(*THREE_VLLM[:2], _member("c", gpus=0)), _node(8))
    assert _devices(p)["server-c-0"] == "" and _devices(p)["trainer-c"] == ""  # on a GPU node: never GPU 0
    assert p.slot("server-c-0").asked == 0


@pytest.mark.parametrize(
    ("members", "colocate", "gpus", "needed"),
    [
        (TWO_ONE_GPU, False, 2, 4),
        (TWO_ONE_GPU, False, 1, 4),
        (TWO_ONE_GPU, True, 1, 2),
        (THREE_VLLM, False, 4, 9),
        (THREE_VLLM, True, 4, 5),
        (TWO_ONE_GPU, False, 0, 4),
    ],
)
def test_a_plan_needing_more_gpus_than_the_node_has_is_refused_saying_what_to_change(
    members: tuple[dict[str, Any], ...], colocate: bool, gpus: int, needed: int
) -> None:
    p = plan(_cfg(*members, colocate=colocate), _node(gpus))
    assert not p.fits and p.needed == needed
    assert p.problems[0] == f"the plan needs {needed} GPUs; the node has {gpus or 'none'}"
    hints = "\n".join(p.hints)
    assert f"a node with {needed} GPUs or more (this one: {gpus}" in hints
    assert "fewer GPUs per member" in hints
    if not colocate:
        colocated = plan(_cfg(*members, colocate=True), _node(64)).needed
        assert f"placement: {{colocate: true}} runs each trainer on its server's GPUs: {colocated} GPUs" in hints


def test_a_trainer_group_of_the_planners_choice_needs_distinct_gpus() -> None:
    cfg = _cfg(_member("a", trainer_processes=2), _member("b"))
    assert plan(cfg, _node(8)).slot("trainer-a").devices == ("1", "2")
    assert plan(cfg, []).fits and plan(cfg, []).slot("trainer-a").devices == ()  # CPU: a gloo group
    short = plan(cfg, _node(1))
    assert not short.fits and "trainer-a: needs 2 GPUs at once" in short.problems[0]


@pytest.mark.parametrize(
    ("members", "colocate", "gpus", "shares"),
    [
        # Alone on their GPUs, vLLM servers take 0.9 (split among those on one GPU).
        (
            (_member("a", gpus=1, backend="vllm", role="frozen"), _member("b", backend="vllm", role="frozen")),
            False,
            2,
            (0.9, 0.9),
        ),
        (
            (_member("a", backend="vllm", role="frozen"), _member("b", backend="vllm", role="frozen")),
            False,
            1,
            (0.45, 0.45),
        ),
        # With a trainer on the GPU they take placement.server_memory_share (0.5).
        ((_member("a", gpus=1, backend="vllm"), _member("b", gpus=1, backend="vllm")), True, 2, (0.5, 0.5)),
        ((_member("a", backend="vllm"), _member("b", backend="vllm")), False, 1, (0.25, 0.25)),
        # A member's own gpu_memory_utilization wins (the plan sets none).
        (
            (
                _member("a", gpus=1, backend="vllm", vllm={"gpu_memory_utilization": 0.7}),
                _member("b", gpus=1, backend="vllm"),
            ),
            True,
            2,
            (None, 0.5),
        ),
    ],
)
def test_vllm_memory_shares(
    members: tuple[dict[str, Any], ...], colocate: bool, gpus: int, shares: tuple[float | None, ...]
) -> None:
    p = plan(_cfg(*members, colocate=colocate), _node(gpus))
    assert tuple(p.slot(f"server-{m['name']}-0").memory_share for m in members) == shares


def test_gpus_set_the_tensor_parallel_size_and_the_trainer_group() -> None:
    cfg = _cfg(_member("a", gpus=4, backend="vllm"), _member("b", gpus=1, trainer={"gpus": 2}))
    a, b = cfg.members
    assert (a.vllm.tensor_parallel_size, a.trainer_processes, b.trainer_processes) == (4, 4, 2)
    p = plan(cfg, _node(8))
    assert (p.slot("server-a-0").tensor_parallel, p.slot("trainer-a").processes) == (4, 4)
    assert not p.fits and p.needed == 11  # 4 + 4 + 1 + 2
    assert (_devices(p)["server-a-0"], _devices(p)["trainer-a"]) == ("0,1,2,3", "4,5,6,7")
    colocated = plan(
        _cfg(_member("a", gpus=4, backend="vllm"), _member("b", gpus=1, trainer={"gpus": 2}), colocate=True), _node(8)
    )
    assert colocated.fits and colocated.needed == 6
    assert _devices(colocated) == {
        "server-a-0": "0,1,2,3",
        "trainer-a": "0,1,2,3",
        "server-b-0": "4",
        "trainer-b": "4,5",
    }


@pytest.mark.parametrize(
    ("member", "error"),
    [
        (_member("a", gpus=2), "a transformers server uses one GPU"),
        (
            _member("a", gpus=2, backend="vllm", vllm={"tensor_parallel_size": 4}),
            "gpus: 2 but vllm.tensor_parallel_size: 4",
        ),
        (_member("a", gpus=2, backend="vllm", trainer_processes=3), "trainer_processes: 3 on 2 GPU"),
        (_member("a", role="frozen", trainer={"gpus": 1}), "not trained: it has no trainer"),
        ({"name": "a", "endpoint": {"base_url": "http://x/v1", "model": "m"}, "gpus": 1}, "outside endpoint"),
    ],
)
def test_gpus_that_cannot_be_followed_are_config_errors(member: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        _cfg(member, _member("b"))


def test_a_config_with_gpus_reads_back_as_written() -> None:
    cfg = _cfg(_member("a", gpus=2, backend="vllm"), _member("b", trainer={"gpus": 2}), colocate=True)
    assert parse_config(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize(
    ("env", "count", "limit", "expected"),
    [
        ({}, 0, None, []),
        ({}, 4, None, ["0", "1", "2", "3"]),
        ({}, 8, 2, ["0", "1"]),
        ({"CUDA_VISIBLE_DEVICES": "2,5"}, 8, None, ["2", "5"]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 8, 1, ["GPU-aa"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, 8, None, []),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 8, None, []),
    ],
)
def test_the_node_is_what_cuda_visible_devices_or_the_driver_shows(
    env: dict[str, str], count: int, limit: int | None, expected: list[str]
) -> None:
    assert node_devices(limit, env=env, count=count) == expected


def test_asking_for_more_gpus_than_the_node_has_is_refused() -> None:
    with pytest.raises(NodeError, match="--gpus 3: this node has 2 GPU"):
        node_devices(3, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert visible({}) is None


def test_gpus_are_counted_by_nvidia_smi_or_the_driver(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-2)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert gpu_count(str(smi), tmp_path / "absent") == 2
    driver = tmp_path / "gpus"
    for pci in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (driver / pci).mkdir(parents=True)
    assert gpu_count(str(tmp_path / "no-smi"), driver) == 3
    assert gpu_count(str(tmp_path / "no-smi"), tmp_path / "absent") == 0


class _Group:
    """What ``start_services`` starts, recorded (a ``ProcessGroup`` without processes)."""

    def __init__(self) -> None:
        self.env: dict[str, dict[str, str]] = {}
        self.args: dict[str, list[str]] = {}

    def start(self, name: str, args: list[str], health_url: str | None = None, env: Any = None) -> None:
        self.env[name], self.args[name] = dict(env or {}), list(args)

    def wait_healthy(self) -> None:
        pass


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_corl_run_starts_each_child_on_its_planned_devices(gpus: int, tmp_path: Path) -> None:
    cfg = _cfg(
        _member("a", gpus=1, backend="vllm"),
        _member("b", gpus=1, trainer={"gpus": 2 if gpus == 8 else 1}),
        _member("c", backend="vllm", role="frozen"),
        colocate=gpus < 4,
    )
    p = plan(cfg, _node(gpus))
    if gpus == 1:
        assert not p.fits
        return
    assert p.fits, p.problems
    group = _Group()
    start_services(cfg, tmp_path, group, 9999, placement=p)  # type: ignore[arg-type]
    planned = _devices(p)
    for name in ("server-a-0", "server-b-0", "server-c-0", "trainer-a", "trainer-b"):
        assert group.env[name]["CUDA_VISIBLE_DEVICES"] == planned[name], name
    assert "CUDA_VISIBLE_DEVICES" not in group.env["aggregator"]
    for name in ("server-a-0", "server-c-0"):  # vLLM servers on GPUs: the plan's memory share
        if planned[name]:
            assert group.env[name]["CORL_VLLM__GPU_MEMORY_UTILIZATION"] == str(p.slot(name).memory_share)
        else:  # no GPU left for the planner's choice: the CPU, with the server's own setting
            assert len(p.used) == gpus and "CORL_VLLM__GPU_MEMORY_UTILIZATION" not in group.env[name]
    assert "CORL_VLLM__GPU_MEMORY_UTILIZATION" not in group.env["server-b-0"]  # transformers
    if gpus == 8:  # trainer b is a group of 2 ranks under torchrun, on its 2 GPUs
        args = group.args["trainer-b"]
        assert args[args.index("--nproc-per-node") + 1] == "2" and len(planned["trainer-b"].split(",")) == 2
    elif gpus < 4:
        assert planned["trainer-a"] == planned["server-a-0"]  # colocated


def test_corl_run_sets_no_devices_on_a_node_without_gpus(tmp_path: Path) -> None:
    cfg = _cfg(*FOUR_AUTO)
    group = _Group()
    start_services(cfg, tmp_path, group, 9999, placement=plan(cfg, []))  # type: ignore[arg-type]
    assert not [n for n, env in group.env.items() if "CUDA_VISIBLE_DEVICES" in env]


def _write(tmp_path: Path, *members: dict[str, Any], colocate: bool = False) -> Path:
    import yaml

    path = tmp_path / "cohort.yaml"
    path.write_text(yaml.safe_dump({"members": list(members), "placement": {"colocate": colocate}}))
    return path


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_corl_plan_prints_the_table_and_refuses_oversubscription(gpus: int, tmp_path: Path) -> None:
    config = _write(tmp_path, *TWO_ONE_GPU, _member("c", gpus=1, backend="vllm", role="frozen"))
    res = CliRunner().invoke(app, ["plan", "--config", str(config), "--gpus", str(gpus)], env={"COLUMNS": "200"})
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in res.output.splitlines()
        if line.startswith("│")
    }
    if gpus < 5:
        assert res.exit_code == 2, res.output
        assert f"plan: the plan needs 5 GPUs; the node has {gpus}" in res.output
        assert "placement: {colocate: true} runs each trainer on its server's GPUs: 3 GPUs" in res.output
        return
    assert res.exit_code == 0, res.output
    assert f"device plan: 5 of {gpus} GPU(s)" in res.output
    assert {k: v[0] for k, v in rows.items()} == {
        "server-a-0": "0",
        "server-b-0": "2",
        "server-c-0": "4",
        "trainer-a": "1",
        "trainer-b": "3",
    }
    assert rows["server-c-0"][3] == "0.90"


def test_corl_plan_without_gpus_plans_this_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _write(tmp_path, *TWO_ONE_GPU, colocate=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,7")
    res = CliRunner().invoke(app, ["plan", "--config", str(config)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "device plan: 2 of 2 GPU(s)" in res.output and "│ 3 " in res.output and "│ 7 " in res.output


def test_the_gpu_node_example_fits_two_gpus_and_says_what_to_do_on_one(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "gpu-node.yaml"
    ok = CliRunner().invoke(app, ["plan", "--config", str(example), "--gpus", "2"], env={"COLUMNS": "200"})
    assert ok.exit_code == 0, ok.output
    one = CliRunner().invoke(app, ["plan", "--config", str(example), "--gpus", "1"], env={"COLUMNS": "200"})
    assert one.exit_code == 2 and "no gpus: asks: the planner then shares this node's 1 GPU(s)" in one.output
