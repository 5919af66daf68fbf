"""Hub data, offline: ``task.source: hf:<repo>[:<config>][@<split>]`` is read through
``datasets.load_dataset`` from a data set repository this module lays out in the hub cache
(``HF_HOME``, ``HF_HUB_OFFLINE=1``), its usual fields become the task's problems, and where they came
from (repo, config, split, commit, rows) is logged like the packaged sources'."""

from __future__ import annotations

import builtins
import logging
import sys
from pathlib import Path

import pytest
from hub_cache import add_dataset

from corl.config import ConfigError, TaskConfig, parse_config
from corl.data import load_splits, parse_source
from corl.data.hub import read_hub
from corl.data.sources import HubSource, parse_hub_source
from corl.hub import HubError

TRAIN = [{"question": f"What is {a} plus {a}?", "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"} for a in range(1, 9)]
TEST = [{"question": f"What is {a} times 3?", "answer": f"#### {3 * a}"} for a in range(1, 5)]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    home = tmp_path_factory.mktemp("hf-data")
    return home, add_dataset(home / "hub", "tiny-org/sums", {"train": TRAIN, "test": TEST})


@pytest.fixture
def offline(hf_home: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    home, commit = hf_home
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))  # datasets' own, per test
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    # The libraries read HF_HUB_OFFLINE once, at import: one imported earlier in the session (by another
    # test) would ask the network for an absent set and wait out its DNS timeouts (24 s here).
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return commit


@pytest.mark.parametrize(
    ("rest", "parsed"),
    [
        ("openai/gsm8k", HubSource("openai/gsm8k")),
        ("openai/gsm8k:main", HubSource("openai/gsm8k", "main")),
        ("openai/gsm8k@test", HubSource("openai/gsm8k", None, "test")),
        ("openai/gsm8k:main@test", HubSource("openai/gsm8k", "main", "test")),
        ("openai/gsm8k:main@train[:200]", HubSource("openai/gsm8k", "main", "train[:200]")),
    ],
)
def test_hf_sources_parse(rest: str, parsed: HubSource) -> None:
    assert parse_hub_source(rest) == parsed
    assert parse_source(f"hf:{rest}") == ("hf", rest)


@pytest.mark.parametrize("rest", ["gsm8k", "openai/gsm8k:ma in", "openai/gsm8k@te st", "/abs/path", ""])
def test_malformed_hf_sources_are_config_errors(rest: str) -> None:
    with pytest.raises(ConfigError, match="hf:"):
        parse_config({"task": {"name": "math", "source": f"hf:{rest}"}, "members": [_m("a"), _m("b")]})


def _m(name: str) -> dict:
    return {"name": name, "model": "/m", "servers": [f"http://127.0.0.1:{len(name)}"]}


def test_a_split_is_read_with_its_provenance(offline: str) -> None:
    records, provenance = read_hub("tiny-org/sums:main@test")
    assert records == TEST
    assert provenance == {"repo": "tiny-org/sums", "config": "main", "split": "test", "revision": offline, "rows": 4}


def test_every_split_is_read_when_none_is_named(offline: str) -> None:
    records, provenance = read_hub("tiny-org/sums:main")
    assert records == TEST + TRAIN  # split-name order
    assert (provenance["split"], provenance["rows"]) == ("test+train", 12)


def test_a_run_reads_the_usual_fields_and_logs_where_they_came_from(
    offline: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corl.data")
    splits = load_splits(TaskConfig(name="math", source="hf:tiny-org/sums:main@train", eval_size=2), seed=0)
    assert len(splits.eval) == 2 and len(splits.rl) == 6
    by_prompt = {e.prompt: e.answer for e in [*splits.rl, *splits.eval]}
    assert set(by_prompt) == {r["question"] for r in TRAIN}
    assert by_prompt["What is 3 plus 3?"] == "6"  # GSM8K's '#### 6' read by the math task
    line = next(r.getMessage() for r in caplog.records if "tiny-org/sums" in r.getMessage())
    for part in ("repo=tiny-org/sums", "config=main", "split=train", f"revision={offline}", "rows=8"):
        assert part in line, line


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("tiny-org/absent@test", "hf:tiny-org/absent@test"),
        ("tiny-org/sums:other@test", "hf:tiny-org/sums:other@test: .*'other'"),
        ("tiny-org/sums:main@validation", "hf:tiny-org/sums:main@validation: .*validation"),
    ],
)
def test_what_cannot_be_read_is_named(offline: str, spec: str, match: str) -> None:
    with pytest.raises(HubError, match=match):
        read_hub(spec)


def test_without_datasets_the_error_names_the_extra(offline: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_datasets(name: str, *args: object, **kwargs: object) -> object:
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.delitem(sys.modules, "datasets", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(HubError, match=r"pip install 'corl\[hub\]'"):
        read_hub("tiny-org/sums:main@test")
