"""The cohort config's ``gateway`` section: the harvesting gateway (``corl serve gateway``) an agent app
points its OpenAI ``base_url`` at, what it harvests into the run's prompt pool, and the canary rule for
new versions of the members it serves."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .base import Name, Share, _Section

GatewayRoute = Literal["chat", "completions"]


class RedactConfig(_Section):
    """Applied to every harvested or imported conversation before anything is stored: the patterns
    first, then the hook; what they replace never reaches Redis, a file or a log."""

    patterns: list[str] = Field(
        default_factory=list,
        description="Regular expressions (Python re syntax); every match is replaced by `replacement`.",
    )
    replacement: str = Field(default="[REDACTED]", description="What a redacted span becomes.")
    hook: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="module:function, a Python callable taking a text and returning it redacted (names, "
        "addresses, what regexes miss); it runs after the patterns, on every turn. A hook that raises drops the "
        "conversation (counted), never stores it unredacted.",
    )

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        for i, pattern in enumerate(v):
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"patterns[{i}] is not a regular expression: {err}") from None
        return v


class HarvestConfig(_Section):
    """What the gateway keeps of the traffic it forwards (the run's prompt pool, Redis)."""

    enabled: bool = Field(default=True, description="Harvest at all (off: the gateway only forwards).")
    sample: float = Field(
        default=1.0, ge=0.0, le=1.0, description="Share of the opted-in requests harvested (each drawn at random)."
    )
    routes: list[GatewayRoute] = Field(
        default_factory=lambda: list[GatewayRoute](["chat"]),
        description="Routes opted in: chat (/v1/chat/completions: its messages) and completions (/v1/completions: "
        "a prompt as one user turn).",
    )
    members: list[Name] | None = Field(
        default=None, description="Members whose traffic is harvested (the request's model); None: every member."
    )
    max_chars: int = Field(
        default=16_000, ge=1, description="Size bound: a conversation with more characters is not harvested."
    )
    max_messages: int = Field(
        default=64, ge=1, description="Size bound: a conversation with more turns is not harvested."
    )
    dedupe: bool = Field(
        default=True, description="Harvest a conversation (after redaction) once per retention window."
    )
    max_prompts: int = Field(
        default=10_000, ge=1, description="Pool bound: the newest this many conversations are kept, older dropped."
    )
    retention_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="Retention bound: a conversation older than this is neither trained on nor kept.",
    )
    redact: RedactConfig = Field(default=RedactConfig(), description="Redaction before anything is stored.")


class CanaryConfig(_Section):
    """New versions of a member reach the gateway's traffic by stages: a share, then all once the
    evaluator's reading of the version is not worse than the serving version's; else rolled back."""

    share: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Share of a member's gateway traffic a new version gets until it is promoted; 0: off (a "
        "version serves as soon as its trainer swaps it in).",
    )
    tolerance: Share = Field(
        default=0.0,
        description="Held-out accuracy a new version may lose against the serving version and still be promoted.",
    )
    stable: dict[Name, list[str]] = Field(
        default_factory=dict,
        description="Per trained member, base URLs of replicas outside members[].servers that keep the serving "
        "version: the gateway swaps a promoted version into them (admin token); members[].servers, which the "
        "trainer swaps, carry the new version and get the canary share.",
    )
    poll_s: float = Field(default=5.0, gt=0, description="How often versions and readings are checked.")


class GatewayConfig(_Section):
    url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s?#@]+$",
        description="Where the gateway listens (corl run starts it there; compose and Helm: its service address); "
        "None: corl run starts one on a free port when the prompt source is harvest.",
    )
    harvest: HarvestConfig = Field(default=HarvestConfig(), description="What is harvested into the prompt pool.")
    canary: CanaryConfig = Field(default=CanaryConfig(), description="How new versions reach the gateway's traffic.")
