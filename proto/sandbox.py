"""``POST /v1/run`` of the sandbox service: one untrusted program, run in its jail."""

from typing import Literal

from pydantic import Field

from ._base import WireInt, WireModel, WireRequest

ProgramStatus = Literal["ok", "error", "timeout", "killed"]


class ProgramLimits(WireModel):
    """What one program may use; the service caps each at its own bound (422 past it)."""

    timeout_s: float = Field(default=10.0, gt=0, le=120, description="Wall clock.")
    cpu_s: WireInt = Field(default=5, ge=1, le=60, description="CPU seconds (RLIMIT_CPU).")
    memory_bytes: WireInt = Field(default=1 << 30, ge=1 << 24, le=8 << 30, description="Address space.")
    file_bytes: WireInt = Field(default=1 << 20, ge=1, le=16 << 20, description="Any file it writes, stdout included.")
    processes: WireInt = Field(default=16, ge=1, le=64, description="Processes of the sandbox uid (RLIMIT_NPROC).")


class RunProgramRequest(WireRequest):
    source: str = Field(min_length=1, max_length=1 << 20, description="Python source, run as main.py.")
    limits: ProgramLimits = Field(default_factory=ProgramLimits)


class RunProgramResponse(WireModel):
    status: ProgramStatus = Field(description="ok: exit 0; error: non-zero exit; timeout; killed: a signal (rlimit).")
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float = Field(ge=0.0)
