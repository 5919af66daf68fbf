"""Tasks: prompt generation and answer canonicalisation, pluggable by name."""

import dataclasses

from .addition import AdditionTask
from .arith import ArithTask
from .base import Example, Splits, Task, extract_all, is_correct_many
from .chat import ChatTask
from .code import CodeTask
from .math import MathTask

_TASKS: dict[str, type] = {
    "addition": AdditionTask,
    "arith": ArithTask,
    "chat": ChatTask,
    "code": CodeTask,
    "math": MathTask,
}


def task_names() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str, rubric: str | None = None) -> Task:
    """The task plug-in ``name``; ``rubric`` replaces the judge rubric of a task that reads one (chat)."""
    try:
        task = _TASKS[name]()
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {task_names()}") from None
    if rubric is not None:
        if not reads_rubric(name):
            raise ValueError(f"task {name!r} reads no rubric (only free-form tasks do: chat)")
        task = dataclasses.replace(task, rubric=rubric)
    return task  # type: ignore[no-any-return]


def reads_rubric(name: str) -> bool:
    """Does task ``name`` judge against a rubric the config (and a grade request) can set?"""
    cls = _TASKS.get(name)
    return cls is not None and dataclasses.is_dataclass(cls) and "rubric" in {f.name for f in dataclasses.fields(cls)}


__all__ = [
    "AdditionTask",
    "ArithTask",
    "ChatTask",
    "CodeTask",
    "Example",
    "MathTask",
    "Splits",
    "Task",
    "extract_all",
    "get_task",
    "is_correct_many",
    "reads_rubric",
    "task_names",
]
