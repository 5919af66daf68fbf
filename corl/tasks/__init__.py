"""Tasks: prompt generation and answer canonicalisation, pluggable by name."""

from .addition import AdditionTask
from .base import Example, Splits, Task
from .math import MathTask

_TASKS: dict[str, type] = {"addition": AdditionTask, "math": MathTask}


def get_task(name: str) -> Task:
    try:
        return _TASKS[name]()  # type: ignore[no-any-return]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {sorted(_TASKS)}") from None


__all__ = ["AdditionTask", "Example", "MathTask", "Splits", "Task", "get_task"]
