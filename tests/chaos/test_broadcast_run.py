"""A whole run as real processes (Redis, two ``corl serve model``, the aggregator, ``corl train``) with
full-weight training and a version every step, once with ``weight_transfer: broadcast`` and once with
``files``: every published version is swapped in exactly once, the server ends on the newest, the
run's stats say how versions went; the round time of each is recorded (``record_figure``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from chaos_cluster import Cluster, Proc, start_servers, wait_for

pytestmark = pytest.mark.chaos
ROUNDS = 12


@pytest.fixture
def servers(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[dict[str, Proc]]:
    """Fresh servers per run: a run's versions start at 1."""
    procs = start_servers(tmp_path_factory.mktemp("servers"), tiny_model_dir, ["alpha", "beta"])
    try:
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def _swaps(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r'^corl_server_weight_updates_total\{result="ok"\} (\S+)$', text, re.M)
    return int(float(found.group(1))) if found else 0


@pytest.mark.parametrize("transfer", ["broadcast", "files"])
def test_every_version_is_swapped_in(
    tmp_path: Path,
    tiny_model_dir: Path,
    servers: dict[str, Proc],
    record_figure: Callable[..., None],
    transfer: str,
) -> None:
    training = {"weight_transfer": transfer, "max_staleness": 1000}
    c = Cluster(tmp_path, tiny_model_dir, servers, {"alpha": "trained", "beta": "frozen"}, training, max_rounds=ROUNDS)
    config = yaml.safe_load(c.config.read_text())
    config["reward"] = {"mode": "random"}  # a signal every step (the random tiny model rarely votes alike)
    c.config.write_text(yaml.safe_dump(config))
    try:
        c.start()
        procs = [c.aggregator, c.trainers["alpha"]]
        t0 = time.monotonic()
        wait_for(f"{ROUNDS} rounds", lambda: c.round_state()[0] >= ROUNDS, 300, procs)
        rounds_s = time.monotonic() - t0
        ids = {b.batch_id for b in c.batches("alpha")}
        wait_for("every batch applied", lambda: c.applied("alpha") >= ids, 120, procs)
        wait_for("the newest version served", lambda: c.served_version("alpha") >= c.published("alpha") > 0, 60)
        published, served = c.published("alpha"), c.served_version("alpha")
        stats = httpx.get(f"{c.aggregator.url}/v1/runs/{c.run}/stats", timeout=10).json()
        log = c.trainers["alpha"].tail(100_000)
    finally:
        c.close()
    swaps = _swaps(servers["alpha"].url or "")
    broadcasts = len(re.findall(r"published alpha version \d+ \(\w+\): broadcast to \['", log))
    record_figure(
        transfer=transfer,
        rounds=ROUNDS,
        seconds_per_round=round(rounds_s / ROUNDS, 3),
        versions_published=published,
        versions_swapped=swaps,
        versions_by_broadcast=broadcasts,
    )
    assert stats["weight_transfer"] == {"alpha": transfer}
    # Versions start at 1 in a fresh run: each one was swapped in once, by broadcast or by files.
    assert served == published and swaps == published
    assert (broadcasts == published) if transfer == "broadcast" else broadcasts == 0
