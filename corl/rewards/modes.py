"""The one table of reward modes: name -> pure function, and what each mode reads.

Config validation (``corl.proto.RewardModeName``), the aggregator (``grade_round``), the docs and
the invariant tests all read this table; adding a mode is one entry here and its name in
``proto/modes.py`` (checked equal at import, as is ``VOTE_READING_MODES``, what the config asks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from corl.proto import VOTE_READING_MODES, RewardModeName

from .controls import format_rewards, random_rewards
from .inputs import Answers, RewardInputs, RewardOutcome
from .judge import peer_judge_rewards
from .votes import (
    ground_truth_rewards,
    no_rewards,
    peer_agreement_rewards,
    peer_label_rewards,
    peer_pool_rewards,
    peer_soft_rewards,
    peer_weighted_rewards,
    self_vote_rewards,
)

RewardFn = Callable[[RewardInputs], RewardOutcome]


@dataclass(frozen=True)
class RewardMode:
    name: RewardModeName
    fn: RewardFn
    description: str
    peer: bool  # rewards come only from other members (the cohort's label-free modes)
    uses_labels: bool = False  # reads dataset answers: experiments only
    judged: bool = False  # needs /v1/grade judge scores from peers
    control: bool = False  # a label-free baseline that reads no peer (a peer mode's gain counts above it)
    formats: bool = False  # reads each sample's formatted flag (Task.is_formatted)

    @property
    def label_free(self) -> bool:
        return not self.uses_labels

    @property
    def votes(self) -> bool:
        """Its rewards come from the members' votes (so ``reward.votes`` samples change them)."""
        return not (self.judged or self.uses_labels or self.control or self.fn is no_rewards)


_MODES = (
    RewardMode(
        "peer_label",
        peer_label_rewards,
        "1 if the answer equals the majority of the other members' pseudo-labels (plurality of each "
        "peer's G answers; ties discarded; optional `threshold`, `topology: ring`): Co-RL",
        peer=True,
    ),
    RewardMode(
        "peer_agreement",
        peer_agreement_rewards,
        "reliability-weighted fraction of the other members' samples that give the same answer",
        peer=True,
    ),
    RewardMode(
        "peer_pool",
        peer_pool_rewards,
        "1 if the answer equals the plurality of the other members' samples pooled together (every "
        "peer sample one vote; ties and pooled shares below `threshold` give no label; with `surer_peers`, "
        "neither does a prompt where the member is surer of its own plurality than its peers of theirs)",
        peer=True,
    ),
    RewardMode(
        "peer_weighted",
        peer_weighted_rewards,
        "1 if the answer equals the other members' pooled vote with each peer weighted by its learnt "
        "reliability and each of its answers by the peer's confidence (its share of the peer's samples, "
        "squared); below `threshold` of the peers' total weight: no label",
        peer=True,
    ),
    RewardMode(
        "peer_soft",
        peer_soft_rewards,
        "the answer's share of the other members' pooled samples over the top answer's share; each prompt's "
        "advantages weighted by that top share, 0 below `threshold` (RESTRAIN-style)",
        peer=True,
    ),
    RewardMode(
        "peer_judge",
        peer_judge_rewards,
        "k peers (never the author) plus external graders score it through `/v1/grade` judge mode (an outside "
        "endpoint member through its OpenAI API); reliability-weighted mean, median or trimmed mean",
        peer=True,
        judged=True,
    ),
    RewardMode(
        "self_vote",
        self_vote_rewards,
        "1 if it equals the member's *own* plurality (TTRL-style baseline; collapses)",
        peer=False,
    ),
    RewardMode(
        "ground_truth",
        ground_truth_rewards,
        "1 if it equals the data set's answer (upper bound for experiments only)",
        peer=False,
        uses_labels=True,
    ),
    RewardMode(
        "random",
        random_rewards,
        "control: 1 with probability `p` (default 0.5), seeded per round; reads no answer, label or peer",
        peer=False,
        control=True,
    ),
    RewardMode(
        "format",
        format_rewards,
        "control: 1 when the response is in the form the task asks for (e.g. the number alone), else 0",
        peer=False,
        control=True,
        formats=True,
    ),
    RewardMode("none", no_rewards, "0 (no training signal)", peer=False),
)

REWARD_MODES: dict[str, RewardMode] = {m.name: m for m in _MODES}
PEER_VOTE_MODES: tuple[str, ...] = tuple(m.name for m in _MODES if m.peer and not m.judged)

if set(REWARD_MODES) != set(get_args(RewardModeName)):
    raise ImportError(f"reward modes {sorted(REWARD_MODES)} differ from the contract's {get_args(RewardModeName)}")
if {m.name for m in _MODES if m.votes} != VOTE_READING_MODES:
    raise ImportError(f"the modes that read votes differ from the contract's {sorted(VOTE_READING_MODES)}")


def markdown_table() -> str:
    """The README's table of reward modes, generated from this one."""
    from corl.config import RewardConfig

    default = RewardConfig().mode
    rows = ["| mode | reward of a sample | uses labels? |", "|---|---|---|"]
    for m in _MODES:
        name = f"`{m.name}`" + (" (default)" if m.name == default else "")
        rows.append(f"| {name} | {m.description} | {'yes' if m.uses_labels else 'no'} |")
    return "\n".join(rows)


def compute_rewards(
    mode: str,
    answers: Answers,
    *,
    members: Sequence[str] | None = None,
    threshold: float = 0.0,
    surer_peers: bool = False,
    topology: Literal["all", "ring"] = "all",
    order: Sequence[str] | None = None,
    reliability: Mapping[str, float] | None = None,
    dataset_answers: Sequence[str | None] | None = None,
    votes: Answers | None = None,
    teachers: Mapping[str, str] | None = None,
    formatted: Mapping[str, Sequence[Sequence[bool]]] | None = None,
    seed: int = 0,
    p: float = 0.5,
) -> RewardOutcome:
    """Per-sample rewards for ``members`` (default: every member in ``answers``) from one round of
    answers, by a vote mode of ``REWARD_MODES``. Every member in ``answers``
    votes (frozen members too). ``reliability`` (member -> weight, default 1.0) weighs
    ``peer_agreement`` votes. ``dataset_answers`` reaches only modes that use labels. ``votes``:
    samples drawn only to vote (default: the rewarded ``answers`` vote). ``teachers``: teacher ->
    the one member it votes for, beside that member's peers. ``formatted``, ``seed``, ``p``: the
    controls'. ``surer_peers``: ``peer_pool``'s abstention where the member is surer than its peers."""
    spec = REWARD_MODES.get(mode)  # type: ignore[call-overload]
    if spec is None or spec.judged:
        hint = "; peer_judge rewards come from judge_rewards()" if mode == "peer_judge" else ""
        vote = [m for m, s in REWARD_MODES.items() if not s.judged]
        raise ValueError(f"unknown vote reward mode {mode!r}; expected one of {vote}{hint}")
    inp = RewardInputs(
        answers=answers,
        votes=votes,
        members=list(members) if members is not None else list(answers),
        threshold=threshold,
        surer_peers=surer_peers,
        topology=topology,
        order=order,
        teachers=teachers,
        reliability=reliability,
        dataset_answers=dataset_answers if spec.uses_labels else None,
        formatted=formatted,
        seed=seed,
        p=p,
    )
    return spec.fn(inp)
