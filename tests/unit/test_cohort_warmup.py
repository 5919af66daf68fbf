"""Warm-up: the supervised encoding and the stop-in-band / roll-back logic."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from corl.cohort import warmup as warmup_mod
from corl.cohort.presets import WarmupSettings
from corl.cohort.warmup import IGNORE, encode_supervised, warm_up
from corl.models.tokenizer import build_char_tokenizer
from corl.tasks import AdditionTask, Example


@pytest.fixture()
def micro_model() -> Iterator[torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    from corl.cohort.presets import get_preset

    torch.manual_seed(0)
    spec = get_preset("micro").members[0]
    yield AutoModelForCausalLM.from_config(spec.build_config(build_char_tokenizer()))


def test_encode_supervised_labels_only_answer_and_eos() -> None:
    tok = build_char_tokenizer()
    ids, labels = encode_supervised(tok, [Example("12+34=", "46"), Example("99+99=", "198")])
    assert ids.shape == labels.shape == (2, 10)
    assert tok.decode(ids[0, :8].tolist()) == "12+34=46" and ids[0, 8] == tok.eos_token_id
    assert ids[0, 9] == tok.pad_token_id  # right padding
    assert labels[0].tolist()[:6] == [IGNORE] * 6 and labels[0, 9] == IGNORE
    assert labels[1, 6:].tolist() == tok("198", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    with pytest.raises(ValueError, match="no answer"):
        encode_supervised(tok, [Example("1+1=")])


def _scripted(monkeypatch: pytest.MonkeyPatch, accs: dict[int, float], steps: list[int]) -> None:
    """Make the accuracy check return ``accs[step]``, reading the step from the model's update count."""

    def fake_accuracy(model, tokenizer, task, examples, **kw):  # noqa: ANN001, ANN003, ANN202
        return accs[steps[-1]]

    monkeypatch.setattr(warmup_mod, "greedy_accuracy", fake_accuracy)


def _run(model, accs: dict[int, float], monkeypatch: pytest.MonkeyPatch, **settings):  # noqa: ANN001, ANN003, ANN202
    steps: list[int] = []
    _scripted(monkeypatch, accs, steps)
    task = AdditionTask()
    data = task.splits(0).warmup[:64]
    checks: list[tuple[int, float]] = []
    res = warm_up(
        model,
        build_char_tokenizer(),
        task,
        data,
        data[:4],
        WarmupSettings(batch_size=16, **settings),
        on_step=lambda s, _loss: steps.append(s),
        on_check=lambda s, a: checks.append((s, a)),
    )
    return res, checks


def test_stops_at_first_check_in_band(micro_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    res, checks = _run(micro_model, {2: 0.1, 4: 0.3, 6: 0.45, 8: 0.5}, monkeypatch, check_every=2, max_steps=20)
    assert (res.steps, res.accuracy, res.in_band, res.rollbacks) == (6, 0.45, True, 0)
    assert checks == [(2, 0.1), (4, 0.3), (6, 0.45)]


def test_overshoot_rolls_back_and_refines(micro_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    # 0.3 at step 4, then 0.8 at step 6 overshoots: back to step 4's weights, then check every step.
    res, checks = _run(micro_model, {2: 0.1, 4: 0.3, 6: 0.8, 5: 0.5}, monkeypatch, check_every=2, max_steps=20)
    assert checks == [(2, 0.1), (4, 0.3), (6, 0.8), (5, 0.5)]
    assert (res.steps, res.accuracy, res.in_band, res.rollbacks) == (5, 0.5, True, 1)


def test_missing_the_band_keeps_the_closest_checkpoint(micro_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    at_check: dict[int, dict[str, torch.Tensor]] = {}
    steps: list[int] = []
    _scripted(monkeypatch, {2: 0.2, 4: 0.35, 6: 0.9}, steps)
    task = AdditionTask()
    data = task.splits(0).warmup[:64]
    res = warm_up(
        micro_model,
        build_char_tokenizer(),
        task,
        data,
        data[:4],
        WarmupSettings(batch_size=16, check_every=2, max_steps=6, max_rollbacks=0),
        on_step=lambda s, _loss: steps.append(s),
        on_check=lambda s, _a: at_check.setdefault(s, {k: v.clone() for k, v in micro_model.state_dict().items()}),
    )
    assert (res.steps, res.accuracy, res.in_band) == (4, 0.35, False)
    assert all(torch.equal(at_check[4][k], v) for k, v in micro_model.state_dict().items())


def test_without_band_trains_exactly_max_steps(micro_model) -> None:  # noqa: ANN001
    task = AdditionTask()
    data = task.splits(0).warmup[:64]
    before = {k: v.clone() for k, v in micro_model.state_dict().items()}
    res = warm_up(
        micro_model, build_char_tokenizer(), task, data, data[:4], WarmupSettings(batch_size=16, max_steps=3, band=None)
    )
    assert res.steps == 3 and not res.in_band and len(res.history) == 1
    assert any(not torch.equal(before[k], v) for k, v in micro_model.state_dict().items())
