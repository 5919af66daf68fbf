"""The code task on real HumanEval problems: programs are read from completions as models write
them, their behaviour on the prompt's own examples is the vote, and the hidden tests only evaluate."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from corl.data.sources import read_packaged
from corl.sandbox import Limits
from corl.tasks import CodeTask, Example, extract_all, get_task, is_correct_many
from corl.tasks.code_text import code_of, entry_point, example_calls, program


@pytest.fixture(scope="module")
def task() -> CodeTask:
    t = get_task("code")
    assert isinstance(t, CodeTask)
    return replace(t, limits=Limits(timeout_s=4.0, cpu_s=2, memory_bytes=512 << 20))


@pytest.fixture(scope="module")
def humaneval() -> dict[str, dict[str, Any]]:
    return {r["task_id"]: r for r in read_packaged("humaneval")[0]}


def test_humaneval_loads_with_hidden_tests_in_meta_only(task: CodeTask, humaneval: dict[str, dict[str, Any]]) -> None:
    assert len(humaneval) == 164
    ex = task.example(humaneval["HumanEval/0"])
    assert ex.answer is None and "def check(candidate)" in ex.meta["test"]
    assert ex.meta["entry_point"] == "has_close_elements" == entry_point(ex.prompt)
    assert all(entry_point(r["prompt"]) == r["entry_point"] for r in humaneval.values())


def test_example_calls_come_from_the_docstring(humaneval: dict[str, dict[str, Any]]) -> None:
    assert example_calls(humaneval["HumanEval/0"]["prompt"]) == [
        "has_close_elements([1.0, 2.0, 3.0], 0.5)",
        "has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)",
    ]
    # "For lst = [1,2,3] the output should be 14" style examples become calls too.
    assert example_calls(humaneval["HumanEval/133"]["prompt"])[0] == "sum_squares([1, 2, 3])"
    with_examples = sum(bool(example_calls(r["prompt"])) for r in humaneval.values())
    assert with_examples == 154


FENCED = "Here is the function:\n```python\n{prompt}{body}\n```\nIt works by ..."


@pytest.mark.parametrize("style", ["plain", "fenced", "fenced-unclosed", "def-only"])
def test_programs_are_read_in_every_style(humaneval: dict[str, dict[str, Any]], style: str) -> None:
    rec = humaneval["HumanEval/2"]  # truncate_number
    body = rec["canonical_solution"]
    completion = {
        "plain": body + "\n\nprint(truncate_number(3.5))\n",
        "fenced": FENCED.format(prompt=rec["prompt"], body=body),
        "fenced-unclosed": "```python\ndef truncate_number(number: float) -> float:\n" + body,
        "def-only": "def truncate_number(number: float) -> float:\n" + body,
    }[style]
    src = program(rec["prompt"], completion)
    assert src is not None and "print(truncate_number" not in src and "It works" not in src
    assert code_of("no code here") == "no code here"


def test_canonical_solutions_pass_and_wrong_ones_fail(task: CodeTask, humaneval: dict[str, dict[str, Any]]) -> None:
    ids = ["HumanEval/0", "HumanEval/2", "HumanEval/13", "HumanEval/133"]
    examples = [task.example(humaneval[i]) for i in ids]
    right = [humaneval[i]["canonical_solution"] for i in ids]
    assert is_correct_many(task, examples, right) == [True] * 4
    assert is_correct_many(task, examples, ["    return 0\n"] * 4) == [False] * 4
    assert not task.is_correct(examples[0], "this is not code")


def test_behaviour_votes(task: CodeTask, humaneval: dict[str, dict[str, Any]]) -> None:
    rec = humaneval["HumanEval/13"]  # greatest_common_divisor(a, b)
    p = rec["prompt"]
    canonical = rec["canonical_solution"]
    rewritten = (
        "```python\nimport math\n\ndef greatest_common_divisor(a: int, b: int) -> int:\n    return math.gcd(a, b)\n```"
    )
    wrong = "    return a * b\n"
    crashing = "    raise ValueError('no')\n"
    looping = "    while True:\n        pass\n"
    answers = extract_all(task, [(p, canonical), (p, rewritten), (p, wrong), (p, crashing), (p, looping), (p, "")])
    assert answers[0] is not None and answers[0] == answers[1]  # same behaviour, different text: one vote
    assert answers[2] is not None and answers[2] != answers[0]
    assert answers[3:] == [None, None, None]  # raises everywhere, times out, no code: no valid answer


def test_votes_never_read_the_hidden_tests(task: CodeTask, humaneval: dict[str, dict[str, Any]]) -> None:
    rec = humaneval["HumanEval/13"]
    honest = task.example(rec)
    poisoned = Example(honest.prompt, None, {**honest.meta, "test": "def check(c):\n    raise SystemExit(1)\n"})
    completion = rec["canonical_solution"]
    # The vote depends on the prompt and completion only; a poisoned test changes evaluation alone.
    assert task.extract_answer(honest.prompt, completion) == task.extract_answer(poisoned.prompt, completion)
    assert task.is_correct(honest, completion) and not task.is_correct(poisoned, completion)


def test_hostile_completion_gives_no_answer_and_touches_nothing(task: CodeTask, tmp_path: Any) -> None:
    prompt = 'def add(a, b):\n    """Add.\n    >>> add(1, 2)\n    3\n    """\n'
    target = tmp_path / "owned"
    hostile = f"    open({str(target)!r}, 'w').write('x')\n    return a + b\n"
    assert task.extract_answer(prompt, hostile) is None and not target.exists()
    assert task.extract_answer(prompt, "    return a + b\n") is not None


def test_stop_strings_do_not_cut_a_chat_answer_at_its_own_def(task: CodeTask) -> None:
    chat_answer = "```python\ndef f(x):\n    return x\n```\n"
    assert not any(s in chat_answer[: chat_answer.index("return")] for s in task.stop)
    assert task.prompt_format.template == "{prompt}" and task.prompt_format.chat


def test_peer_label_rewards_from_behaviour_on_a_real_problem(task: CodeTask, humaneval: dict[str, Any]) -> None:
    """A round of the code task: each member is rewarded when its program behaves like its peer's
    plurality program; hidden tests and canonical solutions never enter."""
    from corl.config import RewardConfig
    from corl.proto import GenerateResponse
    from corl.rewards import grade_round

    rec = humaneval["HumanEval/23"]  # strlen
    right = [
        "    return len(string)\n",
        "```python\ndef strlen(string: str) -> int:\n    return sum(1 for _ in string)\n```",
    ]
    wrong = "    return len(string) + 1\n"

    def response(texts: list[str]) -> GenerateResponse:
        samples = [{"text": t, "token_ids": [1], "logprobs": [0.0], "finish_reason": "stop"} for t in texts]
        results = [{"prompt": rec["prompt"], "prompt_token_ids": [1], "samples": samples}]
        return GenerateResponse.model_validate({"model": "m", "weight_version": 0, "results": results})

    responses = {"a": response([right[0], right[1], wrong]), "b": response([right[1], right[0], "garbage("])}
    out = grade_round(responses, task, RewardConfig(mode="peer_label"), {"a": 1.0, "b": 1.0})
    assert out.members["a"].rewards == [[1.0, 1.0, 0.0]]  # b's plurality: the right behaviour
    assert out.members["b"].rewards == [[1.0, 1.0, 0.0]]  # a's plurality: the same behaviour
    assert out.members["b"].answers[0][2] is None
