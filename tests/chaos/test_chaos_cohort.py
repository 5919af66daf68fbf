"""Chaos with real processes: kill -9 of the aggregator, of Redis and of a model server in the middle
of a run. Each test records its figures (``record_figure``; docs/RELIABILITY.md quotes them).

The three model servers are shared by the tests of this module (starting them is most of the cost);
every test has its own Redis (AOF, fsync always), run id, aggregator and trainers.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from chaos_cluster import Cluster, Proc, lost_and_duplicated, start_servers, wait_for, wait_ready

from corl.config import load_config
from corl.tasks import get_task

pytestmark = pytest.mark.chaos
Record = Callable[..., None]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[dict[str, Proc]]:
    procs = start_servers(tmp_path_factory.mktemp("servers"), tiny_model_dir, ["alpha", "beta", "gamma"])
    try:
        yield procs
    finally:
        for p in procs.values():
            p.stop()


@pytest.fixture
def cluster_of(tmp_path: Path, tiny_model_dir: Path, servers: dict[str, Proc]) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(roles: dict[str, str], training: dict[str, object] | None = None, **rounds: object) -> Cluster:
        made.append(Cluster(tmp_path, tiny_model_dir, servers, roles, training, **rounds))
        return made[-1]

    yield make
    for c in made:
        c.close()


def trained_twice(trainer_log: str) -> list[str]:
    """Batch ids the trainer took a step on more than once (from its per-step log lines)."""
    steps = Counter(re.findall(r"step \d+ batch (\S+):", trainer_log))
    return sorted(b for b, n in steps.items() if n > 1)


def test_kill9_aggregator_mid_round(cluster_of: Callable[..., Cluster], record_figure: Record) -> None:
    rounds, per_round = 10, 2
    # No trainers: batches stay in the streams, so every write can be counted.
    c = cluster_of(
        {"alpha": "trained", "beta": "trained"}, max_rounds=rounds, max_pending_batches=1000, prompts_per_round=2
    )
    c.start(trainers=False)
    wait_for("round 3 committed", lambda: c.round_state()[0] >= 3, 120, [c.aggregator])
    time.sleep(0.05)  # the driver is generating round 3 (or later) now
    c.aggregator.kill9()
    at_kill = c.round_state()
    assert at_kill[0] < rounds, "the run finished before the kill: nothing was tested"

    t0 = time.monotonic()
    c.aggregator.start()
    wait_for("a round after the restart", lambda: c.round_state()[0] > at_kill[0], 120, [c.aggregator])
    recover_s = time.monotonic() - t0
    wait_for(f"{rounds} rounds", lambda: c.round_state()[0] >= rounds, 180, [c.aggregator])
    time.sleep(0.5)
    batches = {m: c.batches(m) for m in ("alpha", "beta")}
    lost = {m: lost_and_duplicated(bs, rounds)[0] for m, bs in batches.items()}
    duplicated = {m: lost_and_duplicated(bs, rounds)[1] for m, bs in batches.items()}
    record_figure(
        killed_at_round=at_kill[0],
        batches_lost=sum(map(len, lost.values())),
        batches_duplicated=sum(map(len, duplicated.values())),
        seconds_to_first_round_after_restart=round(recover_s, 2),
    )
    log = c.aggregator.tail(400)
    assert f"continuing at round {at_kill[0]} (prompt cursor {at_kill[1]})" in log, log
    assert c.round_state() == (rounds, rounds * per_round)
    assert [s.round for s in c.round_stats()] == list(range(rounds)), "a round's stats were written twice or never"
    # Each round took the prompts at its own cursor: none skipped, none repeated across the kill.
    rl = get_task("addition").splits(load_config(c.config).rounds.prompt_source.seed).rl
    for member, bs in batches.items():
        assert lost[member] == [] and duplicated[member] == [], (member, lost, duplicated)
        assert len({b.batch_id for b in bs}) == len(bs) == rounds
        for b in bs:
            expected = [rl[(b.round * per_round + i) % len(rl)].prompt for i in range(per_round)]
            assert [g.prompt for g in b.groups] == expected, f"round {b.round} of {member} has other prompts"


def test_redis_kill9_and_restart_mid_run(cluster_of: Callable[..., Cluster], record_figure: Record) -> None:
    rounds = 12
    # No batch may be dropped as stale here: every one must be applied.
    c = cluster_of({"alpha": "trained", "beta": "frozen"}, {"max_staleness": 1000}, max_rounds=rounds)
    c.start()
    procs = [c.aggregator, c.trainers["alpha"]]
    wait_for("round 4 and a trained batch", lambda: c.round_state()[0] >= 4 and c.applied("alpha"), 180, procs)
    at_kill = c.round_state()[0]
    c.redis.kill()
    down = httpx.get(f"{c.aggregator.url}/v1/runs/{c.run}/stats", timeout=30)
    time.sleep(1.0)
    t0 = time.monotonic()
    c.redis.start()
    wait_for("a round after Redis came back", lambda: c.round_state()[0] > at_kill, 120, procs)
    recover_s = time.monotonic() - t0
    wait_for(f"{rounds} rounds", lambda: c.round_state()[0] >= rounds, 240, procs)
    ids = {b.batch_id for b in c.batches("alpha")}
    wait_for("every batch applied", lambda: c.applied("alpha") >= ids, 240, procs)

    batches = c.batches("alpha")
    lost, duplicated = lost_and_duplicated(batches, rounds)
    twice = trained_twice(c.trainers["alpha"].tail(100_000))
    record_figure(
        killed_at_round=at_kill,
        redis_down_seconds=1.0,
        stats_status_while_down=down.status_code,
        batches_lost=len(lost),
        batches_duplicated=len(duplicated),
        batches_trained_twice=len(twice),
        processes_restarted=0,
        seconds_to_first_round_after_restart=round(recover_s, 2),
    )
    assert down.status_code == 503 and down.json()["error"]["type"] == "unavailable", down.text
    assert lost == [] and duplicated == [] and twice == []
    assert c.applied("alpha") == {b.batch_id for b in batches}
    assert all(p.alive() for p in procs), "a process died instead of reconnecting"


def test_kill9_model_server_mid_round(
    cluster_of: Callable[..., Cluster], servers: dict[str, Proc], record_figure: Record
) -> None:
    # The default max_staleness: a batch from the restarted server's old weights is dropped, and makes
    # the trainer bring that server to its newest version at once.
    c = cluster_of({"gamma": "trained", "alpha": "frozen", "beta": "frozen"}, min_quorum=2)
    c.start()
    procs = [c.aggregator, c.trainers["gamma"]]
    wait_for("gamma at a published version", lambda: c.published("gamma") >= 2, 180, procs)
    servers["gamma"].kill9()
    at_kill = c.round_state()[0]
    wait_for("3 rounds without gamma", lambda: c.round_state()[0] >= at_kill + 3, 120, procs)

    applied_before = len(c.applied("gamma"))
    newest = c.published("gamma")
    t0 = time.monotonic()
    servers["gamma"].start()
    wait_ready(servers["gamma"])
    ready_s = time.monotonic() - t0
    restart_round = c.round_state()[0]
    wait_for("gamma at the newest weights", lambda: c.served_version("gamma") >= newest, 120, procs)
    to_newest_s = time.monotonic() - t0
    wait_for("gamma trains again", lambda: len(c.applied("gamma")) > applied_before, 120, procs)
    to_training_s = time.monotonic() - t0
    back_round = c.round_state()[0]

    outage = [s for s in c.round_stats() if at_kill < s.round < back_round and "gamma" in s.missing]
    after = [b for b in c.batches("gamma") if b.round >= restart_round]
    on_old = [b for b in after if min(s.weight_version for _, s in b.samples()) < newest]
    record_figure(
        rounds_without_dead_member=len(outage),
        rounds_failed=0,
        seconds_to_server_ready=round(ready_s, 2),
        seconds_to_newest_weights=round(to_newest_s, 2),
        batches_on_older_weights_after_restart=len(on_old),
        of_them_dropped_as_stale=len({b.batch_id for b in on_old} & c.dropped("gamma")),
        seconds_to_training_again=round(to_training_s, 2),
        newest_version_at_restart=newest,
    )
    assert len(outage) >= 3, "rounds did not go on without the dead member"
    assert all(set(s.members) == {"alpha", "beta"} and s.missing == ["gamma"] for s in outage)
    assert after and c.served_version("gamma") >= newest > 0
    assert all(p.alive() for p in procs)
