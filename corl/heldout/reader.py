"""Reading a member's held-out accuracy through its own server (``/v1/info``, ``/v1/generate``).

Whatever the server serves is what is measured (its weight version, its rendering of prompts), on the
task's held-out split: the problems the aggregator never draws RL prompts from. Greedy pass@1, as
``corl eval --config`` measures it (``corl.embedded.evaluate``). Synchronous: ``corl run``'s monitor
calls it between snapshots, the evaluator service from its worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from corl.config import CohortConfig, MemberConfig
from corl.data import load_splits
from corl.embedded.evaluate import evaluate_server
from corl.proto import HeldoutAccuracy, InfoResponse
from corl.tasks import Example, get_task


def client_timeout(cfg: CohortConfig, connect_s: float = 5.0) -> httpx.Timeout:
    """An evaluation request waits like a round's generate call (real models take minutes), at least 60 s."""
    return httpx.Timeout(max(60.0, cfg.rounds.request_timeout_s), connect=connect_s)


class HeldoutReader:
    """Held-out accuracy of the config's served members, each through its first server."""

    def __init__(self, cfg: CohortConfig, http: httpx.Client, eval_prompts: int) -> None:
        self.http = http
        self.task = get_task(cfg.task.name)
        self.sampling = cfg.sampling()
        # A task without a generator reads its held-out problems from task.source; with none (a harvested
        # chat run), there is nothing to read.
        held_out = cfg.task.source is not None or self.task.generates
        self.examples: list[Example] = (
            load_splits(cfg.task, cfg.rounds.prompt_source.seed).eval[:eval_prompts] if held_out else []
        )

    def served_version(self, member: MemberConfig, timeout_s: float | None = None) -> int:
        """The weight version the member's first server answers with (``timeout_s``: the client's own when
        None). Raises ``httpx.HTTPError`` (down, not ready) or ``ValueError`` (not a model server's answer)."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        resp = self.http.get(f"{member.servers[0]}/v1/info", timeout=timeout)
        resp.raise_for_status()
        return InfoResponse.model_validate_json(resp.content).weight_version

    def evaluate(self, member: MemberConfig, advance: Callable[[int], None] = lambda n: None) -> HeldoutAccuracy:
        """Greedy accuracy on the held-out problems, requests of 8 (they interleave with the rounds' own;
        the code task runs each request's programs, sandboxed, against their hidden tests); ``advance(n)``
        after each request. Raises ``httpx.HTTPError`` when the server fails or there is nothing to read."""
        if not self.examples:
            raise httpx.HTTPError("the task has no held-out problems (task.eval_size: 0)")
        r = evaluate_server(self.http, member.servers[0], self.task, self.examples, self.sampling, advance=advance)
        return HeldoutAccuracy(
            accuracy=r.pass_at_1,
            weight_version=r.weight_version,
            parsed=r.parsed,
            formatted=r.formatted,
            at=time.time(),
        )
