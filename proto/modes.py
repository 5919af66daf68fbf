"""The names of the reward modes, as they appear on the wire (``GradedBatch.reward_mode``) and in the
cohort config. ``corl.rewards.modes.REWARD_MODES`` maps each to its pure function and checks at
import that it covers exactly these names."""

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
