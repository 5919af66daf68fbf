"""The in-memory weight path: a member's trainer broadcasts a new version to its server replicas over
a torch.distributed group of their own (gloo on the CPU, NCCL between GPUs), each tensor checked by a
fingerprint as it lands; replicas on the trainer's host copy the bytes from a shared-memory segment
instead (``shared``). Shared by the trainer (the sender) and the model servers (receivers)."""

from . import shared
from .fingerprint import FingerprintKind, fingerprint
from .group import (
    FingerprintMismatch,
    GroupBackend,
    GroupSpec,
    TransferError,
    TransferGroup,
    TransferRefused,
    dtype_name,
    dtype_of,
    local_address,
    open_store,
)

__all__ = [
    "FingerprintKind",
    "FingerprintMismatch",
    "GroupBackend",
    "GroupSpec",
    "TransferError",
    "TransferGroup",
    "TransferRefused",
    "dtype_name",
    "dtype_of",
    "fingerprint",
    "local_address",
    "open_store",
    "shared",
]
