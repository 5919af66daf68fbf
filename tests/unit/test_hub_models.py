"""Hub models, offline: a member's ``model: org/name[@revision]`` resolves through ``huggingface_hub``
against a cache this module builds (``HF_HOME``, ``HF_HUB_OFFLINE=1``; nothing reaches the Hub), is
pinned to its commit in the run directory, keeps that commit when the branch moves, and a model the
cache lacks is refused naming its id; ``corl run`` does all this before it starts anything."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hub_cache import add_model, add_ref, commit_of
from typer.testing import CliRunner

from corl.cli import app
from corl.config import parse_config
from corl.embedded.processes import corl_command
from corl.hub import HubError, describe_error, is_hub_id, locate, parse_id, pin_models, read_pins, resolve
from corl.preflight import model_shape


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf-home")
    add_model(home / "hub", "tiny-org/llama-small", "llama")
    add_model(home / "hub", "tiny-org/gpt2-small", "gpt2")
    add_model(home / "hub", "tiny-org/gpt2-small", "gpt2", ref="v2", seed=1)  # a tag at another commit
    return home


@pytest.fixture
def offline_hub(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return hf_home


def _config(*models: str, servers: int = 9000) -> dict:
    return {
        "run_id": "hub",
        "members": [
            {"name": f"m{i}", "model": model, "servers": [f"http://127.0.0.1:{servers + i}"]}
            for i, model in enumerate(models)
        ],
    }


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("Qwen/Qwen2.5-3B-Instruct", ("Qwen/Qwen2.5-3B-Instruct", None)),
        ("org/name@v1.0", ("org/name", "v1.0")),
        ("org/name@refs/pr/3", ("org/name", "refs/pr/3")),
        ("org/name@" + "a" * 40, ("org/name", "a" * 40)),
        ("/abs/path", None),
        ("cohort/tiny/gpt2", None),
        ("./org/name", None),
        ("name-only", None),
    ],
)
def test_hub_ids_parse(text: str, parsed: tuple[str, str | None] | None) -> None:
    assert parse_id(text) == parsed


def test_an_existing_local_directory_is_never_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id("org/name") and is_hub_id("org/other")


def test_an_id_resolves_to_its_commit_and_the_snapshot_there(offline_hub: Path) -> None:
    model = resolve("tiny-org/gpt2-small")
    commit = commit_of("tiny-org/gpt2-small", "main", "0")
    assert (model.repo, model.revision, model.commit) == ("tiny-org/gpt2-small", "main", commit)
    assert Path(model.path) == offline_hub / "hub" / "models--tiny-org--gpt2-small" / "snapshots" / commit
    tagged = resolve("tiny-org/gpt2-small@v2")
    assert tagged.commit == commit_of("tiny-org/gpt2-small", "v2", "1") != commit
    # The preflight reads the snapshot as any model directory: config and safetensors headers.
    import torch
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
    assert model_shape(model.path).params == sum(p.numel() for p in loaded.parameters())


def test_pins_are_recorded_and_a_resume_keeps_them_when_the_branch_moves(offline_hub: Path, tmp_path: Path) -> None:
    cfg = parse_config(_config("tiny-org/llama-small", "tiny-org/gpt2-small"))
    pinned, pins = pin_models(cfg, tmp_path)
    first = pins["tiny-org/gpt2-small"].commit
    assert [m.model for m in pinned.members] == [pins[m.model].path for m in cfg.members]
    recorded = json.loads((tmp_path / "hub.json").read_text())["models"]
    assert recorded["tiny-org/gpt2-small"]["commit"] == first
    assert recorded["tiny-org/llama-small"]["commit"] == commit_of("tiny-org/llama-small", "main", "0")
    # main now points elsewhere: a new run follows it, the run pinned before does not.
    moved = commit_of("tiny-org/gpt2-small", "v2", "1")
    add_ref(offline_hub / "hub", "tiny-org/gpt2-small", "main", moved)
    try:
        again, _ = pin_models(cfg, tmp_path)
        fresh, fresh_pins = pin_models(cfg, tmp_path / "new-run")
    finally:
        add_ref(offline_hub / "hub", "tiny-org/gpt2-small", "main", first)
    assert again.members[1].model == pinned.members[1].model
    assert fresh_pins["tiny-org/gpt2-small"].commit == moved
    assert read_pins(tmp_path)["tiny-org/gpt2-small"].commit == first


def test_a_model_missing_from_the_cache_is_refused_by_its_id(offline_hub: Path, tmp_path: Path) -> None:
    cfg = parse_config(_config("tiny-org/llama-small", "tiny-org/not-cached"))
    with pytest.raises(HubError, match="tiny-org/not-cached: not in the Hugging Face cache .*HF_HUB_OFFLINE is set"):
        pin_models(cfg, tmp_path)
    with pytest.raises(HubError, match="tiny-org/gpt2-small@v9"):
        locate("tiny-org/gpt2-small@v9")


def test_hub_errors_say_what_to_do(offline_hub: Path) -> None:
    import httpx
    from huggingface_hub import errors

    response = httpx.Response(403, request=httpx.Request("GET", "https://huggingface.co/x"))
    gated = errors.GatedRepoError("gated", response=response)
    missing = errors.RepositoryNotFoundError("missing", response=response)
    revision = errors.RevisionNotFoundError("revision", response=response)
    assert "meta-llama/Llama-3.1-8B is gated" in describe_error("meta-llama/Llama-3.1-8B", gated)
    assert "HF_TOKEN" in describe_error("meta-llama/Llama-3.1-8B", gated)
    assert "https://huggingface.co/datasets/org/set" in describe_error("org/set", gated, kind="dataset")
    assert "org/nope: no such model on the Hub" in describe_error("org/nope", missing)
    assert "org/x@v9: no such revision" in describe_error("org/x@v9", revision)


def _run(args: list[str], cwd: Path, hf_home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run(corl_command(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_corl_run_pins_hub_members_and_its_preflight_reads_their_snapshots(hf_home: Path, tmp_path: Path) -> None:
    """Stopped by the preflight's memory check (--memory 1MB), after pinning and reading the snapshots:
    nothing is started, the pins are in the run directory."""
    config = tmp_path / "hub.yaml"
    config.write_text(yaml.safe_dump(_config("tiny-org/llama-small", "tiny-org/gpt2-small@v2")))
    run_dir = tmp_path / "run"
    res = _run(["run", "--config", str(config), "--out", str(run_dir), "--memory", "1MB"], tmp_path, hf_home)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "hub: tiny-org/gpt2-small@v2 -> " + commit_of("tiny-org/gpt2-small", "v2", "1")[:12] in res.stdout
    assert "server m0" in res.stdout and "DOES NOT FIT" in res.stdout  # estimates read from the snapshots
    pins = json.loads((run_dir / "hub.json").read_text())["models"]
    assert pins["tiny-org/gpt2-small@v2"]["commit"] == commit_of("tiny-org/gpt2-small", "v2", "1")
    assert not (run_dir / "redis").exists() and not (run_dir / "cohort.yaml").exists()


def test_corl_run_refuses_a_model_the_cache_lacks_naming_it(hf_home: Path, tmp_path: Path) -> None:
    config = tmp_path / "hub.yaml"
    config.write_text(yaml.safe_dump(_config("tiny-org/llama-small", "someone/missing-model")))
    run_dir = tmp_path / "run"
    res = _run(["run", "--config", str(config), "--out", str(run_dir)], tmp_path, hf_home)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "preflight: someone/missing-model: not in the Hugging Face cache" in " ".join(res.stdout.split())
    assert not (run_dir / "redis").exists()


def test_cohort_init_from_hub_writes_a_manifest_of_pinned_members(offline_hub: Path, tmp_path: Path) -> None:
    out = tmp_path / "cohort"
    res = CliRunner().invoke(
        app,
        [
            "cohort",
            "init",
            "--out",
            str(out),
            "--from-hub",
            "tiny-org/llama-small",
            "--from-hub",
            "tiny-org/gpt2-small@v2=g2",
        ],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "cohort.json").read_text())
    assert [(m["name"], m["family"], m["hub"]["id"]) for m in manifest["members"]] == [
        ("llama-small", "llama", "tiny-org/llama-small"),
        ("g2", "gpt2", "tiny-org/gpt2-small@v2"),
    ]
    assert manifest["members"][1]["hub"]["commit"] == commit_of("tiny-org/gpt2-small", "v2", "1")
    assert (out / "g2").resolve() == (
        offline_hub / "hub" / "models--tiny-org--gpt2-small" / "snapshots" / commit_of("tiny-org/gpt2-small", "v2", "1")
    )
    assert manifest["members"][0]["params"] == model_shape(out / "llama-small").params > 0
    assert "tiny-org/gpt2-small@v2" in res.output  # the manifest table
    # The cohort runs like any other: corl run --cohort reads its members from the manifest.
    from corl.embedded.config import cohort_members

    assert cohort_members(out) == ["llama-small", "g2"]


def test_cohort_init_from_hub_refuses_a_missing_model_before_linking_any(offline_hub: Path, tmp_path: Path) -> None:
    out = tmp_path / "cohort"
    res = CliRunner().invoke(
        app, ["cohort", "init", "--out", str(out), "--from-hub", "tiny-org/llama-small", "--from-hub", "org/absent"]
    )
    assert res.exit_code == 2
    assert "org/absent" in res.output and not (out / "cohort.json").exists() and not (out / "llama-small").exists()
