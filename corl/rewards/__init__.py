"""Pure reward and diagnostics math for peer-rewarded cohort training (no I/O).

- ``modes``: the one table of reward modes (name -> pure function) and ``compute_rewards``.
- ``inputs``: what a reward function reads and returns; pluralities and pseudo-labels.
- ``votes``: vote-style rewards (peer_label, peer_agreement, peer_pool, baselines).
- ``judge``: robust, reliability-weighted combination of judge grades (peer_judge).
- ``reliability``: online grader weights with probation and quarantine.
- ``diagnostics``: diversity, agreement, label accuracy and the collapse alarm.
- ``round``: ``grade_round``, one round from samples to rewards and diagnostics.
- ``consensus``: the cohort's consensus answer as a reward for outside responses (the reward server).
"""

from corl.rewards.diagnostics import (
    agreement_matrix,
    answer_stats,
    cohort_diversity,
    collapse_round,
    diversity,
    label_accuracy,
    label_share,
    labelled_fraction,
    majority_ratio,
    reward_accuracy,
)
from corl.rewards.inputs import Answers, RewardInputs, RewardOutcome, plurality, pseudo_label, supervisors
from corl.rewards.judge import combine_grades, judge_rewards, weighted_median, weighted_trimmed_mean
from corl.rewards.modes import PEER_VOTE_MODES, REWARD_MODES, RewardMode, compute_rewards
from corl.rewards.reliability import (
    GraderReliability,
    chance_corrected_agreement,
    grade_agreements,
    peer_vote_agreements,
    peer_votes_reliability_update,
)
from corl.rewards.round import MemberOutcome, RoundOutcome, grade_round

__all__ = [
    "collapse_round",
    "majority_ratio",
    "reward_accuracy",
    "PEER_VOTE_MODES",
    "REWARD_MODES",
    "Answers",
    "GraderReliability",
    "MemberOutcome",
    "RewardInputs",
    "RewardMode",
    "RewardOutcome",
    "RoundOutcome",
    "agreement_matrix",
    "answer_stats",
    "chance_corrected_agreement",
    "cohort_diversity",
    "combine_grades",
    "compute_rewards",
    "diversity",
    "grade_agreements",
    "grade_round",
    "judge_rewards",
    "label_accuracy",
    "label_share",
    "labelled_fraction",
    "peer_vote_agreements",
    "peer_votes_reliability_update",
    "plurality",
    "pseudo_label",
    "supervisors",
    "weighted_median",
    "weighted_trimmed_mean",
]
