"""Base classes shared by every wire model: unknown fields are rejected; request bodies are typed
as strictly as the published JSON Schema reads."""

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


class WireModel(BaseModel):
    """A message that crosses a process boundary (HTTP body or Redis entry)."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class WireRequest(WireModel):
    """A request body a service validates: strict types, so what the schema calls invalid is refused
    (422) rather than coerced (``"8"`` or ``true`` for an integer, ``0`` for ``false``)."""

    model_config = ConfigDict(extra="forbid", frozen=False, strict=True)


def _integral(value: Any) -> Any:
    # JSON Schema counts 8.0 as an integer; a strict int would refuse it.
    return int(value) if isinstance(value, float) and value.is_integer() else value


WireInt = Annotated[int, BeforeValidator(_integral)]
