"""The preflight: a missing member is named before anything starts, and a run that cannot fit is
refused with a table naming the process and its figure (``--force`` goes on)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import typer
from rich.console import Console

from corl import preflight
from corl.cli.preflight import parse_size, run_preflight
from corl.config import parse_config

# Gemma-3-270M's sizes (config.json of cohort/trio/gemma3), its weights declared in a safetensors
# header with no data behind it: the preflight reads headers only.
GEMMA = {
    "vocab_size": 262144,
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "tie_word_embeddings": True,
    "dtype": "float32",
}
GEMMA_PARAMS = 268_098_176


def fake_model(path: Path, config: dict, params: int) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    emb = config["vocab_size"] * config["hidden_size"]
    header = {
        "model.embed_tokens.weight": {"dtype": "F32", "shape": [config["vocab_size"], config["hidden_size"]]},
        "model.layers.weight": {"dtype": "F32", "shape": [params - emb]},
        "__metadata__": {"format": "pt"},
    }
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path


def config(tmp_path: Path, micro: int, **training: object) -> object:
    members = [
        {"name": n, "model": str(fake_model(tmp_path / n, GEMMA, GEMMA_PARAMS)), "servers": ["http://127.0.0.1:1"]}
        for n in ("gemma3", "gemma3b")
    ]
    return parse_config(
        {
            "task": {"name": "arith", "source": "gym:basic_arithmetic"},
            "members": members,
            "rounds": {"prompts_per_round": 2, "samples_per_prompt": 8, "max_tokens": 24},
            "training": {"micro_batch_size": micro, **training},
        }
    )


def test_the_shape_comes_from_config_and_headers_and_a_missing_model_is_named(tmp_path: Path) -> None:
    shape = preflight.model_shape(fake_model(tmp_path / "g", GEMMA, GEMMA_PARAMS))
    assert (shape.params, shape.vocab, shape.hidden, shape.layers, shape.kv_width) == (
        GEMMA_PARAMS,
        262144,
        640,
        18,
        256,
    )
    assert shape.linear_params == GEMMA_PARAMS - 262144 * 640  # tied: one vocabulary matrix
    with pytest.raises(preflight.PreflightError, match="no such model directory"):
        preflight.model_shape(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(preflight.PreflightError, match="needs config.json"):
        preflight.model_shape(tmp_path / "empty")


def test_logits_over_a_large_vocabulary_grow_with_the_micro_batch(tmp_path: Path) -> None:
    small, large = (
        preflight.check(config(tmp_path / str(m), m, lora={"r": 16}), tmp_path, memory_available=10**12)
        for m in (2, 16)
    )
    logits = [
        {n.process: n.items["logits"] for n in r.needs if n.process.startswith("trainer")} for r in (small, large)
    ]
    # 16 rows x 25 positions x 262,144 tokens x 16 bytes (logits, float copy, log-softmax, gradient)
    assert logits[1]["trainer gemma3"] == 16 * 25 * 262144 * 16 == 8 * logits[0]["trainer gemma3"]
    servers = [n for n in large.needs if n.process.startswith("server")]
    assert all(n.items["weights x2"] == 2 * GEMMA_PARAMS * 4 for n in servers)  # the serving slot and the spare


def test_a_run_that_cannot_fit_is_refused_with_a_table_and_force_goes_on(tmp_path: Path) -> None:
    cfg = config(tmp_path, 16)
    console = Console(record=True, width=200)
    with pytest.raises(typer.Exit) as refused:
        run_preflight(cfg, tmp_path, console, force=False, memory="4GB")  # type: ignore[arg-type]
    assert refused.value.exit_code == 2
    text = console.export_text()
    assert "trainer gemma3" in text and "server gemma3" in text and "does not fit" in text
    assert "available 4.0 GB: DOES NOT FIT" in text
    full_ft = preflight.trainer_need(cfg.members[0], preflight.model_shape(cfg.members[0].model), cfg)  # type: ignore[attr-defined]
    assert f"{full_ft.total / preflight.GB:.1f} GB" in text  # the trainer's own figure, named
    forced = Console(record=True, width=200)
    run_preflight(cfg, tmp_path, forced, force=True, memory="4GB")  # type: ignore[arg-type]
    assert "starting it anyway" in forced.export_text()
    quiet = Console(record=True)
    run_preflight(cfg, tmp_path, quiet, force=False, memory="1TB")  # type: ignore[arg-type]
    assert quiet.export_text() == ""  # a run that fits prints nothing


@pytest.mark.parametrize(
    ("text", "size"), [("4GB", 4 * 1024**3), ("512MiB", 512 * 1024**2), ("2g", 2 * 1024**3), ("1000", 1000)]
)
def test_sizes_parse(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_a_bad_size_is_refused() -> None:
    with pytest.raises(typer.BadParameter, match="16GB"):
        parse_size("lots")
