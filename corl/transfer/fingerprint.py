"""Per-tensor fingerprints of a weight broadcast: a 64-bit hash of each tensor's bytes, computed by
the sender before it sends and by every receiver once the tensor has arrived. Equal lists mean every
byte arrived as sent: they catch corruption and mismatched manifests, not forgery (the channel is the
member's private group, which only an admin-token request opens).

Two functions, one for each place the bytes live; a group's backend picks one:

- ``xxh3-64`` (gloo groups: CPU tensors): xxHash's XXH3 over the tensor's memory, read in place
  (about 20 GB/s on one core here, sixteen times sha256);
- ``wsum-64`` (NCCL groups: CUDA tensors): the bytes as 64-bit words, each multiplied by a fixed odd
  key of its column (1,024 columns) and the row sums by an odd weight of their row, summed modulo
  2**64, in torch ops at the device's memory speed. A change of any one word always changes it (an
  odd factor keeps every bit of a difference); reordered rows or columns change it too.
"""

from __future__ import annotations

from typing import Literal

import torch

FingerprintKind = Literal["xxh3-64", "wsum-64"]

_COLUMNS = 1024
_BLOCK_ROWS = 4096  # 32 MiB of words per step: bounds the temporaries on any tensor size
_ROW_MUL = 0x2545F4914F6CDD1D  # odd constants below 2**63, so they fit int64
_ROW_ADD = 0x14057B7EF767814F
_LENGTH_MUL = 0x5851F42D4C957F2D
_keys: dict[torch.device, torch.Tensor] = {}


def to_int64(value: int) -> int:
    """An unsigned 64-bit value as the signed int64 with the same bits (what a tensor holds)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def fingerprint(tensor: torch.Tensor, kind: FingerprintKind) -> int:
    """The tensor's fingerprint as a signed 64-bit int (its dtype and shape are the manifest's)."""
    data = tensor.detach()
    if not data.is_contiguous():
        data = data.contiguous()
    raw = data.reshape(-1).view(torch.uint8)
    if kind == "xxh3-64":
        import xxhash

        if raw.device.type != "cpu":
            raise ValueError("xxh3-64 fingerprints CPU tensors; a CUDA group uses wsum-64")
        return to_int64(xxhash.xxh3_64_intdigest(raw.numpy().data))
    return _wsum64(raw)


def _column_keys(device: torch.device) -> torch.Tensor:
    if device not in _keys:
        gen = torch.Generator().manual_seed(0x636F726C)  # "corl": the same keys on every process
        keys = torch.randint(-(2**62), 2**62, (_COLUMNS,), dtype=torch.int64, generator=gen) | 1
        _keys[device] = keys.to(device)
    return _keys[device]


def _row_weights(start: int, stop: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(start, stop, dtype=torch.int64, device=device) * _ROW_MUL + _ROW_ADD) | 1


def _wsum64(raw: torch.Tensor) -> int:
    device, n = raw.device, raw.numel()
    keys = _column_keys(device)
    words = raw[: n // 8 * 8].view(torch.int64)
    rows = words.numel() // _COLUMNS
    total = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, rows, _BLOCK_ROWS):
        stop = min(rows, start + _BLOCK_ROWS)
        block = words[start * _COLUMNS : stop * _COLUMNS].view(-1, _COLUMNS)
        total += ((block * keys).sum(dim=1) * _row_weights(start, stop, device)).sum()
    rest = words[rows * _COLUMNS :]  # fewer than one row of words, then fewer than 8 bytes
    tail = raw[n // 8 * 8 :].to(torch.int64)
    for row, part in ((rows, rest), (rows + 1, tail)):
        if part.numel():
            total += (part * keys[: part.numel()]).sum() * _row_weights(row, row + 1, device)[0]
    return to_int64(int(total.item()) + n * _LENGTH_MUL)
