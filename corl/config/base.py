"""What every section of the cohort config shares: unknown keys are errors, names are DNS-safe."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]
Share = Annotated[float, Field(ge=0.0, le=1.0)]  # a share, a probability or an accuracy
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]  # a share that must be above 0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
