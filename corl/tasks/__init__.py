"""Tasks: prompt generation and answer canonicalisation, pluggable by name."""

from .addition import AdditionTask
from .arith import ArithTask
from .base import Example, Splits, Task, extract_all, is_correct_many
from .code import CodeTask
from .math import MathTask

_TASKS: dict[str, type] = {"addition": AdditionTask, "arith": ArithTask, "code": CodeTask, "math": MathTask}


def task_names() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    try:
        return _TASKS[name]()  # type: ignore[no-any-return]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {task_names()}") from None


__all__ = [
    "AdditionTask",
    "ArithTask",
    "CodeTask",
    "Example",
    "MathTask",
    "Splits",
    "Task",
    "extract_all",
    "get_task",
    "is_correct_many",
    "task_names",
]
