"""Data sources in the cohort config: packaged sets, reasoning-gym generators and local files become
the task's examples, split into seeded, disjoint RL and held-out sets that every process agrees on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from corl.config import ConfigError, TaskConfig, load_config, parse_config
from corl.data import load_splits, split_examples
from corl.tasks import Example

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = [{"name": n, "model": "unused", "servers": ["http://x"]} for n in ("a", "b")]
RECORDS = [{"question": f"What is {i} plus {i}?", "answer": f"{2 * i}.0"} for i in range(30)]


def _prompts(examples: list[Example]) -> list[str]:
    return [e.prompt for e in examples]


def test_splits_are_seeded_disjoint_and_complete() -> None:
    examples = [Example(f"p{i}", str(i)) for i in range(50)] + [Example("p0", "0")]  # a duplicate
    s = split_examples(examples, 3, eval_size=None, eval_fraction=0.2, limit=None)
    assert len(s.eval) == 10 and len(s.rl) == 40 and not set(_prompts(s.eval)) & set(_prompts(s.rl))
    assert split_examples(examples, 3, eval_size=None, eval_fraction=0.2, limit=None) == s
    assert _prompts(split_examples(examples, 4, eval_size=None, eval_fraction=0.2, limit=None).eval) != _prompts(s.eval)
    small = split_examples(examples, 3, eval_size=5, eval_fraction=0.2, limit=12)
    assert (len(small.eval), len(small.rl)) == (5, 7)
    # Problems without an answer (CHAMP's prose answers) are RL prompts, never held out.
    mixed = [Example(f"q{i}", None if i % 2 else str(i)) for i in range(20)]
    s = split_examples(mixed, 0, eval_size=8, eval_fraction=0.2, limit=None)
    assert len(s.eval) == 8 and all(e.answer is not None for e in s.eval) and len(s.rl) == 12


@pytest.mark.parametrize("fmt", ["jsonl", "json", "jsonl.gz", "parquet", "save_to_disk"])
def test_local_files_resolve_against_the_config_and_answers_are_canonical(tmp_path: Path, fmt: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    name = f"problems.{fmt}" if fmt != "save_to_disk" else "problems"
    path = data / name
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    elif fmt == "json":
        path.write_text(json.dumps(RECORDS))
    elif fmt == "jsonl.gz":
        import gzip

        path.write_bytes(gzip.compress("\n".join(json.dumps(r) for r in RECORDS).encode()))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(RECORDS), path)
    else:
        import datasets

        datasets.Dataset.from_list(RECORDS).save_to_disk(str(path))
    cfg_file = tmp_path / "cohort.yaml"
    cfg_file.write_text(
        yaml.safe_dump({"task": {"name": "math", "source": f"data/{name}", "eval_size": 6}, "members": MEMBERS})
    )
    cfg = load_config(cfg_file)
    assert cfg.task.source == str(path.resolve())
    splits = load_splits(cfg.task, seed=0)
    assert (len(splits.rl), len(splits.eval)) == (24, 6)
    by_prompt = {e.prompt: e.answer for e in splits.rl + splits.eval}
    assert by_prompt["What is 7 plus 7?"] == "14"  # "14.0" canonicalised by the math task


def test_a_config_reports_bad_sources_and_tasks_without_problems() -> None:
    with pytest.raises(ConfigError, match="unknown packaged data set"):
        parse_config({"task": {"name": "math", "source": "packaged:nope"}, "members": MEMBERS})
    with pytest.raises(ConfigError, match="has no generator"):
        parse_config({"task": "math", "members": MEMBERS})
    # A task without a generator is fine when prompts come from elsewhere (POST /v1/prompts).
    parse_config({"task": "math", "members": MEMBERS, "rounds": {"prompt_source": {"kind": "http"}}})
    assert parse_config({"members": MEMBERS}).task == TaskConfig()  # addition's own generator by default


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_splits(TaskConfig(name="math", source=str(tmp_path / "nope.jsonl")))


def test_default_addition_source_is_unchanged() -> None:
    from corl.tasks import AdditionTask

    assert load_splits(TaskConfig(), seed=2) == AdditionTask().splits(2)


def test_gym_generator_is_seeded_and_runs_without_its_dependencies() -> None:
    cfg = TaskConfig(name="math", source="gym:leg_counting", size=12, eval_size=2)
    a, b = load_splits(cfg, seed=1), load_splits(cfg, seed=1)
    assert a == b and len(a.rl) == 10 and all(e.answer and e.answer.isdigit() for e in a.rl)
    assert "legs" in a.rl[0].prompt
    assert _prompts(load_splits(cfg, seed=2).rl) != _prompts(a.rl)


@pytest.mark.parametrize(
    ("example", "task", "source"),
    [("smol-gsm8k", "math", "packaged:gsm8k"), ("smol-humaneval", "code", "packaged:humaneval")],
)
def test_example_configs_validate_and_load_their_data(example: str, task: str, source: str) -> None:
    cfg = load_config(ROOT / "examples" / f"{example}.yaml")
    assert (cfg.task.name, cfg.task.source) == (task, source)
    assert [m.name for m in cfg.members] == ["smollm2", "gemma3"]
    assert all(Path(m.model).resolve() == ROOT / "cohort" / "smol" / m.name for m in cfg.members)
    sampling = cfg.sampling()
    assert sampling.max_tokens >= 256 and sampling.stop  # the task's stop strings reach every generate call
    splits = load_splits(cfg.task, cfg.rounds.prompt_source.seed)
    assert len(splits.eval) == cfg.task.eval_size and len(splits.rl) >= 64
    if task == "code":
        assert all("check" in e.meta["test"] and e.answer is None for e in splits.eval)
    else:
        assert all(e.answer is not None for e in splits.eval)


async def test_rounds_draw_rl_prompts_and_evaluation_uses_the_held_out_ones(tmp_path: Path) -> None:
    import httpx

    from corl.heldout import HeldoutReader
    from corl.services.aggregator.prompts import build_prompt_source

    def server(request: httpx.Request) -> httpx.Response:  # answers every held-out problem; wrong on one
        prompts = json.loads(request.content)["prompts"]
        texts = [f"#### {2 * int(p.split()[2])}" for p in prompts]
        texts[0] = "#### -1"
        results = [
            {
                "prompt": p,
                "prompt_token_ids": [1],
                "samples": [{"text": t, "token_ids": [1], "logprobs": [0.0], "finish_reason": "stop"}],
            }
            for p, t in zip(prompts, texts, strict=True)
        ]
        return httpx.Response(200, json={"model": "a", "weight_version": 3, "results": results})

    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS))
    cfg = parse_config({"task": {"name": "math", "source": str(path), "eval_size": 5}, "members": MEMBERS})
    source = build_prompt_source(cfg, None)  # type: ignore[arg-type]  # no Redis for a task source
    drawn = {e.prompt for e in await source.take(0, 60)}
    with httpx.Client(transport=httpx.MockTransport(server)) as http:
        reader = HeldoutReader(cfg, http, eval_prompts=100)  # what corl run and the evaluator read
        held_out = {e.prompt for e in reader.examples}
        assert len(drawn) == 25 and len(held_out) == 5 and not drawn & held_out
        reading = reader.evaluate(cfg.member("a"))
    assert (reading.accuracy, reading.weight_version) == (0.8, 3)


def test_corl_data_shows_the_splits_of_a_config(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corl.cli import app

    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"task": {"name": "math", "source": "p.jsonl", "eval_size": 4}, "members": MEMBERS}))
    res = CliRunner().invoke(app, ["data", "--config", str(cfg), "--show", "2"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # rich wraps lines to the terminal's width
    assert "26 RL prompts, 4 held out" in text and "What is" in text
