"""The cohort as a reward model for outside trainers: score a response by the cohort's consensus.

Pure functions, no I/O. The cohort's members each sample G answers to a prompt; each member's
pseudo-label is the plurality of its own answers (``pseudo_label``), and the cohort's consensus is
the plurality of those pseudo-labels (ties discarded, as in ``peer_label``). An outside response
is then scored by its canonical answer:

- ``consensus``: 1 if it equals the consensus answer, else 0 (0 when there is no consensus);
- ``agreement``: the reliability-weighted share of all member samples that give the same answer
  (unparseable samples count in the denominator, so a confused cohort gives small scores);
- ``ground_truth``: 1 if it equals the data set's label (read only in this mode).

The response never votes: its author is outside the cohort, so no score depends on its own answer
except through the match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .inputs import plurality, pseudo_label


@dataclass(frozen=True)
class Consensus:
    """What the cohort says about one prompt."""

    answer: str | None  # plurality of the members' pseudo-labels; None: no consensus
    shares: dict[str, float] = field(default_factory=dict)  # answer -> weighted share of member samples
    pseudo_labels: dict[str, str | None] = field(default_factory=dict)  # member -> its own plurality

    @property
    def labelled(self) -> bool:
        return self.answer is not None


def cohort_consensus(
    answers: Mapping[str, Sequence[str | None]],
    *,
    threshold: float = 0.0,
    weights: Mapping[str, float] | None = None,
) -> Consensus:
    """The consensus of ``answers`` (member -> its G canonical answers to one prompt).

    ``weights`` (member -> reliability, default 1) weigh the shares; a member of weight 0 has no
    say in the shares, and the plurality counts only members of positive weight.
    """
    w = {m: 1.0 if weights is None else float(weights.get(m, 1.0)) for m in answers}
    pseudo = {m: pseudo_label(a, threshold) for m, a in answers.items()}
    answer = plurality([pseudo[m] for m in answers if w[m] > 0.0])
    total = 0.0
    shares: dict[str, float] = {}
    for m, samples in answers.items():
        if w[m] <= 0.0:
            continue
        total += w[m] * len(samples)
        for a in samples:
            if a is not None:
                shares[a] = shares.get(a, 0.0) + w[m]
    if total > 0:
        shares = {a: s / total for a, s in shares.items()}
    return Consensus(answer=answer, shares=shares, pseudo_labels=pseudo)


def consensus_rewards(consensus: Consensus, response_answers: Sequence[str | None]) -> list[float]:
    """1 for each response whose answer equals the consensus answer; unparseable answers get 0."""
    return [1.0 if a is not None and a == consensus.answer else 0.0 for a in response_answers]


def agreement_scores(consensus: Consensus, response_answers: Sequence[str | None]) -> list[float]:
    """The weighted share of member samples that agree with each response's answer."""
    return [consensus.shares.get(a, 0.0) if a is not None else 0.0 for a in response_answers]


def label_rewards(response_answers: Sequence[str | None], label_answers: Sequence[str | None]) -> list[float]:
    """``ground_truth`` only: 1 where the response's answer equals the label's canonical answer."""
    if len(response_answers) != len(label_answers):
        raise ValueError(f"{len(label_answers)} labels for {len(response_answers)} responses")
    return [1.0 if a is not None and a == lab else 0.0 for a, lab in zip(response_answers, label_answers, strict=True)]


def split_query(query: str, prompt: str, end_markers: Sequence[str] = ()) -> str:
    """The response part of an OpenRLHF ``query`` (prompt + response, as the trainer decoded it).

    The prompt is cut where the query starts with it (else after its last occurrence; else the
    whole query is the response), and trailing end-of-sequence markers are removed.
    """
    if query.startswith(prompt):
        response = query[len(prompt) :]
    else:
        at = query.rfind(prompt) if prompt else -1
        response = query[at + len(prompt) :] if at >= 0 else query
    return strip_end_markers(response, end_markers)


def strip_end_markers(response: str, end_markers: Sequence[str]) -> str:
    """Remove end-of-sequence / padding markers (and the whitespace around them) from the end of
    ``response``, repeatedly; a response without one is returned as it is."""
    out, changed = response, False
    while True:
        stripped = out.rstrip()
        marker = next((m for m in end_markers if m and stripped.endswith(m)), None)
        if marker is None:
            return stripped if changed else out
        out, changed = stripped[: -len(marker)], True
