"""Build a real (micro) cohort on disk and read it back the way every other component does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corl.cohort.manifest import read_manifest


@pytest.fixture(scope="module")
def micro_cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from corl.cohort.build import build_cohort

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("micro-cohort")
    build_cohort(out, "micro", seed=0)
    return out


def test_micro_cohort_members_load_by_path(micro_cohort: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = read_manifest(micro_cohort)
    assert [m.name for m in manifest.members] == ["gpt2", "llama"]
    assert len({m.family for m in manifest.members}) == 2
    for m in manifest.members:
        d = micro_cohort / m.path
        assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()
        model = AutoModelForCausalLM.from_pretrained(d)
        tok = AutoTokenizer.from_pretrained(d)
        assert model.config.model_type == m.family
        assert sum(p.numel() for p in model.parameters()) == m.params
        assert (model.config.eos_token_id, model.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
        meta = json.loads((d / "corl_member.json").read_text())
        assert (meta["name"], meta["family"], meta["task"]) == (m.name, m.family, "addition")
        assert m.warmup_steps == 4 and 0.0 <= m.accuracy <= 1.0


def test_transformer_members_use_vllm_cpu_head_sizes() -> None:
    from corl.cohort.presets import PRESETS
    from corl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    for preset in PRESETS.values():
        for spec in preset.members:
            cfg = spec.build_config(tok)
            if spec.family == "mamba":
                continue
            hidden = getattr(cfg, "n_embd", None) or cfg.hidden_size
            heads = getattr(cfg, "n_head", None) or cfg.num_attention_heads
            assert hidden // heads in (32, 64), (preset.name, spec.name)


def test_tiny_preset_has_four_families_of_growing_size() -> None:
    from transformers import AutoModelForCausalLM

    from corl.cohort.loading import parameter_count
    from corl.cohort.presets import get_preset
    from corl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tiny = get_preset("tiny")
    counts = {s.name: parameter_count(AutoModelForCausalLM.from_config(s.build_config(tok))) for s in tiny.members}
    assert list(counts) == ["gpt2", "mamba", "llama", "qwen2"]
    assert counts["gpt2"] < counts["mamba"] < counts["llama"] < counts["qwen2"]
    assert 0.05e6 < counts["gpt2"] < 0.2e6 and 0.7e6 < counts["qwen2"] < 1.5e6


def test_evaluate_member_reports_every_metric(micro_cohort: Path) -> None:
    from corl.cohort.evaluate import evaluate_member
    from corl.tasks import AdditionTask

    r = evaluate_member(micro_cohort / "gpt2", AdditionTask(), n_prompts=6, seed=0)
    assert r["n_prompts"] == 6
    for key in ("greedy_acc", "sample_acc", "maj@8_acc", "valid_rate"):
        assert 0.0 <= r[key] <= 1.0
    assert 0.0 <= r["distinct"] <= 8 and 0.0 <= r["entropy"] <= 2.08
    # Greedy is deterministic and matches what the warm-up recorded on the same prompts.
    again = evaluate_member(micro_cohort / "gpt2", AdditionTask(), n_prompts=6, seed=1)
    assert again["greedy_acc"] == r["greedy_acc"]


def test_cli_init_and_eval(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corl.cli import app

    runner = CliRunner()
    out = tmp_path / "c"
    res = runner.invoke(app, ["cohort", "init", "--preset", "micro", "--out", str(out), "--member", "gpt2"])
    assert res.exit_code == 0, res.output
    assert "gpt2" in res.output and (out / "cohort.json").is_file()
    # Not a terminal (logs, CI): progress comes as plain lines, not bars that never draw.
    assert "gpt2: warm-up started" in res.output and "gpt2: done, kept step" in res.output
    res = runner.invoke(app, ["eval", "--cohort", str(out), "--n-prompts", "4", "--json", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output
    assert "maj@8" in res.output
    assert set(json.loads((tmp_path / "e.json").read_text())["members"]) == {"gpt2"}
    res = runner.invoke(app, ["eval", "--cohort", str(tmp_path / "missing")])
    assert res.exit_code != 0 and "cohort init" in res.output


@pytest.mark.slow  # two spawned processes import torch + transformers: ~10-25 s on 2 cores
def test_parallel_build_matches_sequential(micro_cohort: Path, tmp_path: Path) -> None:
    """Two members built in two processes end up exactly as when built one after another."""
    from safetensors.torch import load_file

    from corl.cohort.build import build_cohort

    events: list[tuple[str, str]] = []
    manifest = build_cohort(tmp_path, "micro", seed=0, jobs=2, progress=lambda n, e, s, v: events.append((n, e)))
    sequential = read_manifest(micro_cohort)
    assert [m.name for m in manifest.members] == [m.name for m in sequential.members]
    assert {("gpt2", "done"), ("llama", "done")} <= set(events)
    for m, s in zip(manifest.members, sequential.members, strict=True):
        assert (m.params, m.warmup_steps, m.accuracy) == (s.params, s.warmup_steps, s.accuracy)
        a = load_file(tmp_path / m.path / "model.safetensors")
        b = load_file(micro_cohort / s.path / "model.safetensors")
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_ensure_cohort_builds_only_when_missing(micro_cohort: Path, tmp_path: Path) -> None:
    from rich.console import Console

    from corl.cli.cohort import ensure_cohort

    before = (micro_cohort / "cohort.json").stat().st_mtime_ns
    ensure_cohort(micro_cohort, Console(quiet=True), preset="micro")
    assert (micro_cohort / "cohort.json").stat().st_mtime_ns == before
    fresh = tmp_path / "fresh"
    ensure_cohort(fresh, Console(quiet=True), preset="micro", jobs=1)
    assert [m.name for m in read_manifest(fresh).members] == ["gpt2", "llama"]
