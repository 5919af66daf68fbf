"""Where the gateway forwards: one ``Upstream`` per cohort member, found by the request's ``model``.

A member corl serves is reached at its servers' OpenAI routes (``/v1/chat/completions``,
``/v1/completions``) with the cohort token, plus, when canaried, the gateway's stable replicas
(``gateway.canary.stable``). An outside endpoint member is reached at its ``base_url`` with its own key
(from the environment), by its member name or by the model name it serves; a request that names the
member is sent with the endpoint's model name (the one field the gateway changes). The agent's own
``Authorization`` header is never passed on.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, field
from typing import Literal

from corl.config import CohortConfig, MemberConfig
from corl.proto.gateway import HarvestRoute
from corl.services.errors import NotFoundError
from corl.services.http import bearer_headers

_PATHS = {"corl": {"chat": "/v1/chat/completions", "completions": "/v1/completions"},
          "endpoint": {"chat": "/chat/completions", "completions": "/completions"}}  # fmt: skip


@dataclass
class Replica:
    url: str  # base URL: a corl server's root, or an endpoint's API root (…/v1)
    stable: bool = False  # one of the gateway's stable replicas (gateway.canary.stable)
    version: int | None = None  # the weight version it last reported (corl servers)


@dataclass
class Upstream:
    member: str
    kind: Literal["corl", "endpoint"]
    replicas: list[Replica]
    headers: dict[str, str]
    model: str | None = None  # an endpoint's model name (the request's model is set to it)
    trained_share: float | None = None  # canary: share of traffic for the member's servers (None: no canary)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def url(self, replica: Replica, route: HarvestRoute) -> str:
        return replica.url.rstrip("/") + _PATHS[self.kind][route]

    def body_for(self, body: bytes, model: str) -> bytes:
        """The body to send: unchanged, unless it names an endpoint member by its member name."""
        if self.model is None or model == self.model:
            return body
        return json.dumps({**json.loads(body), "model": self.model}).encode()

    def order(self, rng: random.Random) -> list[Replica]:
        """Replicas in the order to try them: round robin, within the group the canary share picks
        (the other group after it, so a refused connection still finds a replica)."""
        start = next(self._turn)
        if self.trained_share is None:
            n = len(self.replicas)
            return [self.replicas[(start + i) % n] for i in range(n)]
        trained = [r for r in self.replicas if not r.stable]
        stable = [r for r in self.replicas if r.stable]
        first, then = (trained, stable) if rng.random() < self.trained_share else (stable, trained)
        return _rotated(first, start) + _rotated(then, start)


def _rotated(replicas: list[Replica], k: int) -> list[Replica]:
    if not replicas:
        return []
    k %= len(replicas)
    return replicas[k:] + replicas[:k]


def _upstream(m: MemberConfig, cfg: CohortConfig, cohort_token: str | None) -> Upstream:
    if m.endpoint is None:
        stable = [Replica(u, stable=True) for u in cfg.gateway.canary.stable.get(m.name, [])]
        return Upstream(m.name, "corl", [Replica(u) for u in m.servers] + stable, bearer_headers(cohort_token))
    ep = m.endpoint
    key = ep.api_key()  # KeyError naming the variable when it is not set: refuse to start
    headers = bearer_headers(key.get_secret_value() if key else None)
    return Upstream(m.name, "endpoint", [Replica(ep.base_url)], headers, model=ep.model)


class Routes:
    """The routing table of a run's members, built once at start-up."""

    def __init__(self, cfg: CohortConfig, cohort_token: str | None) -> None:
        self.upstreams = {m.name: _upstream(m, cfg, cohort_token) for m in cfg.members}
        self._by_model = dict(self.upstreams)
        for up in self.upstreams.values():  # an endpoint's own model name, where no member has that name
            if up.model is not None:
                self._by_model.setdefault(up.model, up)

    def resolve(self, model: str) -> Upstream:
        try:
            return self._by_model[model]
        except KeyError:
            raise NotFoundError(
                f"model {model!r} is no member of this run; members: {sorted(self.upstreams)}", "model"
            ) from None
