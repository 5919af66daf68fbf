"""The names of the reward modes, as they appear on the wire (``GradedBatch.reward_mode``) and in the
cohort config, and which of them read the members' votes. ``corl.rewards.modes.REWARD_MODES`` maps
each to its pure function and checks at import that it covers exactly these names and agrees on
which read votes (the cohort config asks that here, without importing the reward functions)."""

from typing import Literal

RewardModeName = Literal[
    "peer_label",
    "peer_agreement",
    "peer_pool",
    "peer_weighted",
    "peer_soft",
    "peer_judge",
    "self_vote",
    "ground_truth",
    "random",
    "format",
    "none",
]

# Modes whose rewards come from the members' votes: ``reward.votes`` samples change them, and teachers
# (members that vote for one trained member) only make sense under them.
VOTE_READING_MODES: frozenset[RewardModeName] = frozenset(
    {"peer_label", "peer_agreement", "peer_pool", "peer_weighted", "peer_soft", "self_vote"}
)
