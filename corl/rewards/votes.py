"""Vote-style rewards: peer labels, soft peer agreement and the two baselines.

Every function here is pure. A member's rewards are computed from its peers' canonical answers
only; its own answers decide which of its samples match, never what they are matched against
(``surer_peers`` lets them decide also whether a prompt has a label at all).
Dataset answers are read by the ``ground_truth`` baseline and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .inputs import Answers, RewardInputs, RewardOutcome, check_shapes, plurality, pseudo_label, share


def _match(samples: Sequence[str | None], label: str | None) -> list[float]:
    if label is None:
        return [0.0] * len(samples)
    return [1.0 if a is not None and a == label else 0.0 for a in samples]


def _peer_labels(pseudo: Mapping[str, Sequence[str | None]], sups: Sequence[str], n_prompts: int) -> list[str | None]:
    # Plurality over the supervisors' pseudo-labels; with one supervisor this is its label.
    return [plurality([pseudo[s][p] for s in sups]) for p in range(n_prompts)]


def _agreement_rewards(
    answers: Answers, ballots: Answers, member: str, sups: Sequence[str], reliability: Mapping[str, float] | None
) -> list[list[float]]:
    rewards: list[list[float]] = []
    for p, own in enumerate(answers[member]):
        weighted: dict[str, float] = {}
        total = 0.0
        for s in sups:
            w = 1.0 if reliability is None else float(reliability.get(s, 1.0))
            if w <= 0.0:
                continue
            peer = ballots[s][p]
            total += w * len(peer)
            for a in peer:
                if a is not None:
                    weighted[a] = weighted.get(a, 0.0) + w
        rewards.append([weighted.get(a, 0.0) / total if a is not None and total > 0 else 0.0 for a in own])
    return rewards


def _outcome(inp: RewardInputs, rewards: dict, labels: dict, pseudo: dict | None = None) -> RewardOutcome:
    return RewardOutcome(rewards=rewards, labels=labels, pseudo_labels=pseudo if pseudo is not None else inp.pseudo())


def peer_label_rewards(inp: RewardInputs) -> RewardOutcome:
    """Co-RL: 1 if the sample equals the peers' label (plurality of the supervisors' pseudo-labels,
    ties discarded), else 0; a prompt without a label gives 0 to all its samples."""
    n, pseudo = inp.n_prompts, inp.pseudo()
    labels = {m: _peer_labels(pseudo, inp.supervisors(m), n) for m in inp.members}
    rewards = {m: [_match(s, lab) for s, lab in zip(inp.answers[m], labels[m], strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels, pseudo)


def peer_agreement_rewards(inp: RewardInputs) -> RewardOutcome:
    """Reliability-weighted fraction of the supervisors' samples (invalid ones count in the
    denominator) that equal this sample. ``labels`` holds the peer_label labels as a diagnostic."""
    n, pseudo = inp.n_prompts, inp.pseudo()
    labels, rewards = {}, {}
    for m in inp.members:
        sups = inp.supervisors(m)
        labels[m] = _peer_labels(pseudo, sups, n)
        rewards[m] = _agreement_rewards(inp.answers, inp.ballots, m, sups, inp.reliability)
    return _outcome(inp, rewards, labels, pseudo)


def pooled_labels(answers: Answers, sups: Sequence[str], n_prompts: int, threshold: float = 0.0) -> list[str | None]:
    """Per prompt, the plurality of the supervisors' samples pooled together (every peer sample is
    one vote, so a peer's confidence counts, unlike ``peer_label``'s one label per peer). ``None``
    on a tie, with no valid vote, or (abstention) when the winner's share of all pooled samples,
    unparseable ones included, is below ``threshold``."""
    return [pseudo_label([a for s in sups for a in answers[s][p]], threshold) for p in range(n_prompts)]


def surer_labels(ballots: Answers, member: str, sups: Sequence[str], labels: Sequence[str | None]) -> list[str | None]:
    """``labels`` kept only where the supervisors are surer than ``member``: the label's share of their
    pooled ballots above the share of the member's own plurality in its ballots. A member that is sure
    of an answer is not overruled by peers less sure of theirs; its own answers only decide *where* a
    peer label is taken, never what it is."""
    kept: list[str | None] = []
    for p, label in enumerate(labels):
        pooled = [a for s in sups for a in ballots[s][p]]
        own = ballots[member][p]
        kept.append(label if share(pooled, label) > share(own, plurality(own)) else None)
    return kept


def peer_pool_rewards(inp: RewardInputs) -> RewardOutcome:
    """1 if the sample equals the plurality of the supervisors' pooled samples, else 0; a prompt
    whose pooled vote is tied or below ``threshold`` (or, with ``surer_peers``, no surer than the
    member's own ballots) gives 0 to all its samples."""
    n = inp.n_prompts
    labels = {m: pooled_labels(inp.ballots, inp.supervisors(m), n, inp.threshold) for m in inp.members}
    if inp.surer_peers:
        labels = {m: surer_labels(inp.ballots, m, inp.supervisors(m), labels[m]) for m in inp.members}
    rewards = {m: [_match(s, lab) for s, lab in zip(inp.answers[m], labels[m], strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels)


def weighted_labels(
    answers: Answers,
    sups: Sequence[str],
    n_prompts: int,
    reliability: Mapping[str, float] | None = None,
    threshold: float = 0.0,
) -> list[str | None]:
    """Per prompt, the supervisors' pooled vote with two weights (SCOPE-style): a peer's votes count
    by its learnt reliability, and each of its samples by the peer's confidence in that answer (the
    share of its samples that give it), so a peer's answer counts ``reliability x share^2``. A
    reliable peer that is sure of its answer carries the vote alone; unsure or unreliable peers
    carry it only together. ``None`` on a tie, with no valid vote, or (abstention) when the
    winner's weight is below ``threshold`` of the supervisors' total reliability."""
    labels: list[str | None] = []
    for p in range(n_prompts):
        votes: dict[str, float] = {}
        mass = 0.0
        for s in sups:
            w = 1.0 if reliability is None else float(reliability.get(s, 1.0))
            samples = answers[s][p]
            if w <= 0.0 or not samples:
                continue
            mass += w
            for a in {x for x in samples if x is not None}:
                share = samples.count(a) / len(samples)
                votes[a] = votes.get(a, 0.0) + w * share * share
        ranked = sorted(votes.values(), reverse=True)
        if not ranked or (len(ranked) > 1 and ranked[0] == ranked[1]) or ranked[0] < threshold * mass:
            labels.append(None)
        else:
            labels.append(max(votes, key=votes.__getitem__))
    return labels


def peer_weighted_rewards(inp: RewardInputs) -> RewardOutcome:
    """1 if the sample equals the supervisors' reliability- and confidence-weighted pooled vote
    (``weighted_labels``), else 0; a prompt without a label gives 0 to all its samples."""
    n = inp.n_prompts
    labels = {
        m: weighted_labels(inp.ballots, inp.supervisors(m), n, inp.reliability, inp.threshold) for m in inp.members
    }
    rewards = {m: [_match(s, lab) for s, lab in zip(inp.answers[m], labels[m], strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels)


def pooled_shares(ballots: Answers, sups: Sequence[str], prompt: int) -> dict[str, float]:
    """Each answer's share of the supervisors' pooled ballots on one prompt (unparseable ones count
    in the denominator, so a mostly-broken pool is never confident)."""
    pool = [a for s in sups for a in ballots[s][prompt]]
    counts: dict[str, int] = {}
    for a in pool:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    return {a: c / len(pool) for a, c in counts.items()}


def peer_soft_rewards(inp: RewardInputs) -> RewardOutcome:
    """RESTRAIN-style soft peer reward over the whole answer distribution: a sample's reward is its
    answer's share of the supervisors' pooled ballots relative to the top answer's share (the
    plurality answer gets 1, an answer no peer gave 0), and each prompt's advantages are weighted by
    the pool's consistency (the top share), so a prompt the peers disagree on counts little instead of
    being hard-labelled or dropped. Below ``threshold`` consistency a prompt's weight is 0. ``labels``
    holds the pooled plurality (None on a tie) as the diagnostic."""
    n = inp.n_prompts
    rewards: dict[str, list[list[float]]] = {}
    labels: dict[str, list[str | None]] = {}
    weights: dict[str, list[float]] = {}
    for m in inp.members:
        sups = inp.supervisors(m)
        rewards[m], labels[m], weights[m] = [], [], []
        for p in range(n):
            shares = pooled_shares(inp.ballots, sups, p) if sups else {}
            top = max(shares.values(), default=0.0)
            rewards[m].append(
                [shares.get(a, 0.0) / top if a is not None and top > 0 else 0.0 for a in inp.answers[m][p]]
            )
            weights[m].append(top if top >= inp.threshold else 0.0)
            labels[m].append(plurality([a for s in sups for a in inp.ballots[s][p]]))
    return RewardOutcome(rewards=rewards, labels=labels, pseudo_labels=inp.pseudo(), weights=weights)


def self_vote_rewards(inp: RewardInputs) -> RewardOutcome:
    """Baseline (TTRL-style, collapses): 1 if the sample equals the member's own pseudo-label."""
    check_shapes(inp.ballots, inp.members)
    pseudo = inp.pseudo()
    labels = {m: list(pseudo[m]) for m in inp.members}
    rewards = {m: [_match(s, lab) for s, lab in zip(inp.answers[m], pseudo[m], strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels, pseudo)


def ground_truth_rewards(inp: RewardInputs) -> RewardOutcome:
    """Upper bound for experiments only: 1 if the sample equals the data set's answer."""
    n = inp.n_prompts
    if inp.dataset_answers is None:
        raise ValueError("ground_truth mode needs dataset_answers (the data set has no answers?)")
    if len(inp.dataset_answers) != n:
        raise ValueError(f"dataset_answers has {len(inp.dataset_answers)} entries for {n} prompts")
    truth = list(inp.dataset_answers)
    labels = dict.fromkeys(inp.members, truth)
    rewards = {m: [_match(s, t) for s, t in zip(inp.answers[m], truth, strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels)


def no_rewards(inp: RewardInputs) -> RewardOutcome:
    """Control: every reward is 0 (no training signal)."""
    n = inp.n_prompts
    labels: dict[str, list[str | None]] = {m: [None] * n for m in inp.members}
    return _outcome(inp, {m: [[0.0] * len(s) for s in inp.answers[m]] for m in inp.members}, labels)
