"""The per-tensor fingerprints a weight broadcast is checked with: equal bytes give equal values on
every process, any changed byte (anywhere, in any dtype and size) or moved row gives another."""

from __future__ import annotations

import pytest
import torch

from corl.transfer import fingerprint
from corl.transfer.fingerprint import FingerprintKind, to_int64

KINDS: list[FingerprintKind] = ["xxh3-64", "wsum-64"]


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [
        torch.randn(3000, 7, generator=g),  # more than one row of 1,024 words, with a partial row
        torch.randn(5, generator=g).to(torch.bfloat16),  # 10 bytes: one word and 2 tail bytes
        torch.randint(-(2**40), 2**40, (2048, 3), generator=g),
        torch.randn(1, generator=g).half(),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_equal_bytes_equal_fingerprints(kind: FingerprintKind) -> None:
    for t in _tensors():
        assert fingerprint(t, kind) == fingerprint(t.clone(), kind)
        assert -(2**63) <= fingerprint(t, kind) < 2**63  # fits the int64 tensor it is sent in
    wide = torch.randn(64, 33)
    assert fingerprint(wide.t(), kind) == fingerprint(wide.t().contiguous(), kind)  # bytes in logical order


@pytest.mark.parametrize("kind", KINDS)
def test_any_changed_byte_changes_it(kind: FingerprintKind) -> None:
    for t in _tensors():
        raw = t.reshape(-1).view(torch.uint8)
        before = fingerprint(t, kind)
        for pos in sorted({0, raw.numel() // 2, raw.numel() - 1}):
            for bit in (0, 7):
                changed = t.clone()
                changed.reshape(-1).view(torch.uint8)[pos] ^= 1 << bit
                assert fingerprint(changed, kind) != before, (t.dtype, tuple(t.shape), pos, bit)


@pytest.mark.parametrize("kind", KINDS)
def test_moved_rows_and_lengths_change_it(kind: FingerprintKind) -> None:
    t = torch.randn(4096, 256)
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert fingerprint(swapped, kind) != fingerprint(t, kind)
    zeros = torch.zeros(16)
    assert fingerprint(zeros, kind) != fingerprint(torch.zeros(17), kind)
    assert fingerprint(torch.empty(0), kind) == fingerprint(torch.empty(0, 3), kind)


def test_to_int64_keeps_the_bits() -> None:
    assert to_int64(2**64 - 1) == -1 and to_int64(2**63) == -(2**63) and to_int64(5) == 5
