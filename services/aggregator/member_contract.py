"""What a call to a cohort member promises, whichever kind of member it is: the error it fails with,
and what an outside endpoint's client offers. ``members`` (the calls, model servers' included) and
``endpoints`` (outside servers) both build on this module instead of on each other."""

from __future__ import annotations

from typing import Protocol

from corl.proto import GenerateRequest, GenerateResponse, GradeRequest


class MemberError(Exception):
    """A member's server could not produce a usable answer (after retries)."""


class OutsideMember(Protocol):
    """An outside endpoint member's client (``endpoints.EndpointClient``), as ``MemberClient`` calls it:
    it answers in corl's shapes and fails with ``MemberError``."""

    async def generate(self, req: GenerateRequest) -> GenerateResponse: ...

    async def judge(self, req: GradeRequest) -> list[float | None]:
        """A judge-mode score per item (None: no readable verdict)."""
        ...
