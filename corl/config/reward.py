"""The cohort config's ``reward`` section: the mode, its votes, judges and grader reliability."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from corl.proto import VOTE_READING_MODES, RewardModeName

from .base import Fraction, _Section


class JudgeConfig(_Section):
    k: int = Field(default=2, ge=1, description="Peers that grade each response.")
    combine: Literal["mean", "median", "trimmed_mean"] = Field(
        default="mean", description="How the judges' reliability-weighted scores of a response combine."
    )
    trim: float = Field(default=0.2, ge=0.0, lt=0.5, description="trimmed_mean: weight cut from each tail.")


class ReliabilityConfig(_Section):
    ema: float = Field(default=0.1, gt=0.0, le=1.0, description="Step of a grader's weight towards its agreement.")
    floor: float = Field(default=0.05, ge=0.0, le=1.0, description="Lowest weight the updates leave a grader.")
    probation_weight: float = Field(default=0.1, ge=0.0, le=1.0, description="Starting weight of an outside grader.")
    quarantine_below: float = Field(
        default=0.2, ge=0.0, le=1.0, description="A grader whose weight falls below this is quarantined (weight 0)."
    )
    grounding: Literal["votes", "judges"] = Field(
        default="votes",
        description="What a judge's scores are checked against: votes: the cohort's answer-level vote "
        "consensus on prompts where it is confident (label-free, and right far more often than weak judges); "
        "judges: the leave-one-out consensus of the other judges' scores (for tasks without answers).",
    )
    min_consensus: float = Field(
        default=0.5, gt=0.0, le=1.0, description="votes grounding: plurality share of valid votes that counts."
    )


class VoteConfig(_Section):
    samples: int = Field(
        default=0,
        ge=0,
        description="Vote-only samples per prompt from every member: peers vote with these instead of the "
        "rewarded samples (0: the rewarded samples vote). Costs one more generate call per member and round.",
    )
    temperature: float = Field(default=0.0, ge=0.0, description="Their temperature; 0 is greedy (one sample).")

    @model_validator(mode="after")
    def _greedy_once(self) -> VoteConfig:
        if self.temperature == 0.0 and self.samples > 1:
            raise ValueError(f"votes: {self.samples} greedy samples are identical; use samples: 1 or a temperature > 0")
        return self


class GuardConfig(_Section):
    """The collapse guard (corl.rewards.guard): label-free signals read per member and round."""

    action: Literal["alarm", "hold"] = Field(
        default="alarm",
        description="What a tripped guard does: alarm: log, count and show it; hold: also stop training the "
        "member (it keeps answering and voting at the version that tripped the guard).",
    )
    warmup_rounds: int = Field(default=3, ge=1, description="Rounds whose mean is a member's start.")
    window: int = Field(default=4, ge=1, description="Rounds each signal is averaged over before it is compared.")
    patience: int = Field(default=2, ge=1, description="Consecutive rounds past a bound before the guard trips.")
    distinct_fraction: Fraction | None = Field(
        default=None,
        description="Trips below this fraction of the start's distinct-answer rate (None: not read; a member "
        "that learns the right answer also gives fewer distinct answers).",
    )
    echo_rise: Fraction = Field(
        default=0.2,
        description="Trips when the share of answers copied from the prompt is this much above the start's.",
    )
    formatted_drop: Fraction = Field(
        default=0.3,
        description="Trips when the share in the asked form is this much below the start's.",
    )


class RewardConfig(_Section):
    mode: RewardModeName = Field(
        default="peer_pool",
        description="A mode of corl.rewards.modes.REWARD_MODES; default: the best label-free one in docs/RESULTS.md.",
    )
    threshold: float = Field(default=0.0, ge=0.0, le=1.0, description="Min plurality share for a pseudo-label.")
    surer_peers: bool = Field(
        default=False,
        description="peer_pool: a member takes its peers' label on a prompt only where the label's share of "
        "their pooled ballots is above its own plurality's share of its ballots (its peers are surer than it "
        "is); elsewhere the prompt gives it no label. Its own answers decide where a label is taken, never "
        "what it is.",
    )
    topology: Literal["all", "ring"] = Field(
        default="all", description="Who supervises a member: all other members, or its ring predecessor."
    )
    p: float = Field(default=0.5, ge=0.0, le=1.0, description="random control: each sample's chance of reward 1.")
    votes: VoteConfig = Field(default=VoteConfig(), description="Vote-only samples (any peer mode).")
    judge: JudgeConfig = Field(default=JudgeConfig(), description="peer_judge: how many judges, how combined.")
    reliability: ReliabilityConfig = Field(default=ReliabilityConfig(), description="Graders' learnt weights.")
    guard: GuardConfig = Field(default=GuardConfig(), description="The collapse guard: when to alarm or hold a member.")

    def reads_votes(self) -> bool:
        return self.mode in VOTE_READING_MODES

    def vote_samples(self) -> int:
        """Vote-only samples a round draws per prompt and member: none for a mode that reads no votes
        (so one ``--set reward.votes...`` serves every mode of an experiment, ground truth included)."""
        return self.votes.samples if self.reads_votes() else 0
