"""What every section of the cohort config shares: unknown keys are errors, names are DNS-safe."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
