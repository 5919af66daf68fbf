"""What the members wrote: greedy answers to held-out problems before and after a run, side by side.

A learning figure counts once the answers behind it are read. For each member of a finished run this
loads the starting weights and the run's final ones (its ``final/<member>``: full weights or a LoRA
adapter), renders each problem as the model servers do, answers greedily with the task's stop
strings, and grades with the task's own reader: the table shows the text, what the reader took from
it and whether that is right, so a grade for something the model did not write shows at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corl.config import CohortConfig, MemberConfig
from corl.data import load_splits
from corl.tasks import Example, Task, get_task


@dataclass(frozen=True)
class Answer:
    text: str
    read: str | None
    correct: bool
    formatted: bool


def _load(member: MemberConfig, final: Path | None):  # type: ignore[no-untyped-def]
    from corl.cohort.loading import load_member

    model, tokenizer = load_member(member.model_path())
    if final is not None and (final / "adapter_config.json").exists():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(final)).merge_and_unload()
    elif final is not None:  # full weights: the version's model, the member's own tokenizer
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(final), dtype=model.dtype)
    return model.eval(), tokenizer


def greedy_answers(member: MemberConfig, final: Path | None, task: Task, examples: Sequence[Example]) -> list[Answer]:
    """The member's greedy answers (``final``: the run's weights; None: its starting weights)."""
    from corl.models.sampling import sample
    from corl.services.model.rendering import PromptRenderer

    model, tokenizer = _load(member, final)
    renderer, fmt = PromptRenderer(tokenizer), task.prompt_format
    out = sample(
        model,
        tokenizer,
        [renderer.render(e.prompt, fmt) for e in examples],
        n=1,
        max_tokens=task.max_tokens,
        temperature=0.0,
        stop=task.stop,
    )
    texts = [o.completions[0].text for o in out]
    return [
        Answer(t, task.extract_answer(e.prompt, t), task.is_correct(e, t), task.is_formatted(e.prompt, t))
        for e, t in zip(examples, texts, strict=True)
    ]


def answers_table(cfg: CohortConfig, run_dir: Path, n: int = 12) -> str:
    """Markdown: per member, the first ``n`` held-out problems with the answer before and after."""
    task = get_task(cfg.task.name)
    examples = load_splits(cfg.task, cfg.rounds.prompt_source.seed).eval[:n]
    lines: list[str] = []
    for m in cfg.served_members():
        before = greedy_answers(m, None, task, examples)
        after = greedy_answers(m, run_dir / "final" / m.name, task, examples)
        lines += [
            f"\n{m.name} ({sum(a.correct for a in before)}/{n} -> {sum(a.correct for a in after)}/{n} right):\n",
            "| problem | answer | before | read | after | read |",
            "|---|---|---|---|---|---|",
        ]
        for e, b, a in zip(examples, before, after, strict=True):
            lines.append(f"| {e.prompt} | {e.answer} | {_cell(b.text)} | {_mark(b)} | {_cell(a.text)} | {_mark(a)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("\n", "⏎").replace("`", "'")[:80] + "`"


def _mark(a: Answer) -> str:
    return f"{a.read if a.read is not None else '-'} {'✓' if a.correct else '✗'}"
