"""How a trainer group splits one batch's micro-batches over its ranks (``trainer/sharding.py``)."""

from __future__ import annotations

import pytest

from corl.trainer.sharding import default_micro_batch, split_chunks


@pytest.mark.parametrize(("chunks", "world"), [(1, 2), (3, 2), (4, 2), (5, 4), (2, 3), (7, 3)])
def test_every_micro_batch_goes_to_one_rank_and_every_rank_runs_as_many(chunks: int, world: int) -> None:
    every = [(slice(3 * i, 3 * i + 3), 2 + i) for i in range(chunks)]
    split = [split_chunks(every, rank, world) for rank in range(world)]
    real = [(c.rows, c.length) for part in split for c in part if c.weight == 1.0]
    assert sorted(real, key=lambda c: c[0].start) == every  # each once, none lost
    assert len({len(part) for part in split}) == 1 and len(split[0]) == max(1, -(-chunks // world))
    assert all(
        c.weight == 0.0 and c.rows == slice(0, 1) for part in split for c in part if (c.rows, c.length) not in every
    )


def test_unset_micro_batch_size_gives_each_rank_one_micro_batch() -> None:
    assert [default_micro_batch(16, w) for w in (1, 2, 3, 4)] == [16, 8, 6, 4]
    assert default_micro_batch(1, 4) == 1
