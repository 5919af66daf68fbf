"""``POST /v1/weights``: hot-swap a server's weights to a newer version."""

from typing import Literal

from pydantic import Field

from ._base import WireInt, WireModel, WireRequest

WeightFormat = Literal["full", "lora"]


class WeightUpdateRequest(WireRequest):
    version: WireInt = Field(ge=1, description="Must be greater than the version now serving (else 409).")
    uri: str = Field(
        min_length=1,
        pattern=r"^[^\x00]+$",  # no path holds a NUL byte
        description="Directory in save_pretrained layout (adapter layout for lora).",
    )
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 over the bytes of every *.safetensors file in the directory, in sorted file-name order.",
    )
    format: WeightFormat = "full"


class WeightUpdateResponse(WireModel):
    weight_version: int = Field(ge=0)
    previous_version: int = Field(ge=0)
    swap_seconds: float = Field(ge=0.0, description="Load, verify and swap time.")
