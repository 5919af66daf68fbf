"""Base class shared by every wire model: unknown fields are rejected."""

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """A message that crosses a process boundary (HTTP body or Redis entry)."""

    model_config = ConfigDict(extra="forbid", frozen=False)
