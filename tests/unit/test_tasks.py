"""The synthetic addition task and the char tokenizer: what every member and reward reads."""

from __future__ import annotations

import pytest

from corl.tasks import AdditionTask, get_task


@pytest.fixture(scope="module")
def task() -> AdditionTask:
    return AdditionTask()


def test_splits_are_disjoint_sized_and_seeded(task: AdditionTask) -> None:
    s = task.splits(0)
    assert (len(s.warmup), len(s.rl), len(s.eval)) == (task.n_warmup, task.n_rl, task.n_eval)
    warm, rl, ev = ({e.prompt for e in split} for split in (s.warmup, s.rl, s.eval))
    assert not (warm & rl) and not (warm & ev) and not (rl & ev)
    assert task.splits(0) == s
    assert [e.prompt for e in task.splits(1).eval] != [e.prompt for e in s.eval]


def test_examples_are_zero_padded_sums(task: AdditionTask) -> None:
    for ex in task.splits(3).eval[:50]:
        a, b = ex.prompt.removesuffix("=").split("+")
        assert len(a) == len(b) == 2 and ex.prompt.endswith("=")
        assert ex.answer == str(int(a) + int(b))
    assert AdditionTask.prompt(3, 7) == "03+07="


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("46", "46"),
        ("046", "46"),
        (" 7 ", "7"),
        ("198", "198"),
        ("0", "0"),
        ("00", "0"),
        ("", None),
        ("   ", None),
        ("4a", None),
        ("-3", None),
        ("1234", None),
        ("4 6", None),
        ("12+3", None),
        ("٣", None),
        ("²", None),
        ("1\n2", None),
    ],
)
def test_extract_answer_canonicalises_or_rejects(task: AdditionTask, completion: str, expected: str | None) -> None:
    assert task.extract_answer("12+34=", completion) == expected


def test_get_task_by_name() -> None:
    assert get_task("addition").name == "addition"
    with pytest.raises(ValueError, match="unknown task"):
        get_task("nope")


def test_char_tokenizer_round_trip_and_special_tokens() -> None:
    from corl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    text = "12+34=46? Yes No"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert tok.eos_token_id == 1 and tok.pad_token_id == 0 and tok.bos_token_id == tok.eos_token_id
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    for verdict in ("Y", "N"):
        assert len(tok(verdict, add_special_tokens=False)["input_ids"]) == 1
