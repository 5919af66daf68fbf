"""A member's trainer, as far as its weights go, for the broadcast chaos tests: the project's own
``WeightBroadcaster``, ``cpu_snapshot``, ``WeightsStore`` and ``ReplicaPusher`` publish versions of the
tiny model (each a little different) to the given replicas, as ``Trainer._publish_broadcast`` does:
broadcast, files from the same snapshot, the files to every replica the broadcast missed. One JSON line
per version on stdout.

The test steers it through files: with ``--pause-at N`` the broadcast of the first version stops before
its N-th piece, writes ``<control>/paused`` and waits for ``<control>/go`` (the test kills a replica,
or this process, meanwhile); ``--corrupt`` flips a byte of one piece after its fingerprint was taken;
``--sockets`` keeps the bytes on gloo's sockets (by default replicas on this host copy them from shared
memory: there ``--pause-at N`` stops the trainer at its N-th tensor's fingerprint, the replicas having
copied the version, and ``--corrupt`` changes the third tensor's fingerprint, so that the bytes the
replicas read differ from what the trainer says it wrote);
``--foreign DIR`` sends the first version with another model's tensors (a manifest that is not the
servers' model).

    python broadcast_driver.py --servers URL,URL --model DIR --store DIR --versions 3,4 [--pause-at 5]
        [--control DIR] [--corrupt] [--foreign DIR] [--timeout 10] [--sockets]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from corl.trainer.broadcast import WeightBroadcaster
from corl.trainer.metrics import TrainerMetrics
from corl.trainer.publish import ReplicaPusher, WeightsStore
from corl.trainer.settings import TrainerSettings
from corl.trainer.snapshot import cpu_snapshot
from corl.transfer import TransferGroup
from corl.transfer import group as group_module

TOKEN = "chaos-admin-token"


def _pause(args: argparse.Namespace) -> None:
    (args.control / "paused").write_text("")
    deadline = time.monotonic() + 120
    while not (args.control / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _hooks(args: argparse.Namespace) -> None:
    """Steer the first version's transfer: through the sockets, pieces are counted (``_broadcast``);
    through shared memory, where the replicas copy from the segment meanwhile, the trainer's
    fingerprints (one per tensor, the one thing it does then)."""
    original, fingerprint = TransferGroup._broadcast, group_module.fingerprint
    state: dict[str, Any] = {"pieces": 0, "tensors": 0, "done": False, "sender": None}

    def broadcast(self: TransferGroup, tensor: torch.Tensor) -> Any:
        if self.spec.rank == 0 and not self.last_local and not state["done"] and tensor.numel() > 1:
            state["pieces"] += 1  # (the fingerprint list goes through here too, after the pieces)
            if args.pause_at and state["pieces"] == args.pause_at:
                _pause(args)
                state["done"] = True
            if args.corrupt and state["pieces"] == 3:
                tensor = tensor.clone()
                tensor.view(torch.uint8)[0] ^= 0x01
                state["done"] = True
        return original(self, tensor)

    def fingerprint_hook(tensor: torch.Tensor, kind: Any) -> int:
        value = fingerprint(tensor, kind)
        sender = state["sender"]
        if state["done"] or sender is None or not sender.last_local:  # the sockets' road: ``broadcast``
            return value
        state["tensors"] += 1
        if args.pause_at and state["tensors"] == args.pause_at:
            _pause(args)
            state["done"] = True
        if args.corrupt and state["tensors"] == 3:  # the trainer says it wrote other bytes than the replicas read
            state["done"] = True
            return value ^ 1
        return value

    original_send = TransferGroup.send

    def send(self: TransferGroup, version: int, tensors: Any, local: bool = False) -> int:
        state["sender"] = self  # its ``last_local``, set by the agree step, says which road the bytes take
        return original_send(self, version, tensors, local)

    TransferGroup._broadcast = broadcast  # type: ignore[method-assign]
    TransferGroup.send = send  # type: ignore[method-assign]
    group_module.fingerprint = fingerprint_hook  # type: ignore[assignment]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--versions", required=True)
    ap.add_argument("--pause-at", type=int, default=0)
    ap.add_argument("--control", type=Path, default=Path("."))
    ap.add_argument("--corrupt", action="store_true")
    ap.add_argument("--foreign", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--sockets", action="store_true", help="no shared memory: the bytes go through gloo")
    args = ap.parse_args()
    torch.set_num_threads(1)
    _hooks(args)
    urls = args.servers.split(",")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    http = httpx.Client(timeout=60)
    settings = TrainerSettings(
        admin_token=TOKEN, transfer_timeout_s=args.timeout, transfer_rejoin_s=0, transfer_shared_memory=not args.sockets
    )  # type: ignore[call-arg]
    broadcaster = WeightBroadcaster(
        "alpha",
        urls,
        http,
        {"Authorization": f"Bearer {TOKEN}"},
        settings,
        torch.device("cpu"),
        TrainerMetrics("alpha"),
    )
    store = WeightsStore(args.store, "alpha", keep=10)
    pusher = ReplicaPusher(urls, TOKEN, http, attempts=1)
    snapshot: dict[str, torch.Tensor] | None = None
    for i, version in enumerate(int(v) for v in args.versions.split(",")):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(version)))
        joined = broadcaster.wants_join() and broadcaster.join()
        outcomes: dict[str, str] = {}
        road = None
        t0 = time.monotonic()
        if broadcaster.group is not None and broadcaster.dtype is not None:
            snapshot = cpu_snapshot(model.state_dict(), broadcaster.dtype, snapshot)
            sent = snapshot
            if i == 0 and args.foreign is not None:
                foreign = AutoModelForCausalLM.from_pretrained(args.foreign, dtype=torch.float32)
                sent = cpu_snapshot(foreign.state_dict(), broadcaster.dtype)
            group = broadcaster.group
            outcomes = dict(broadcaster.send(version, sent, str(store.path(version))))
            road = "shared-memory" if group is not None and group.last_local else "sockets"
        broadcast_s = time.monotonic() - t0
        state = None if snapshot is None else dict(snapshot)
        pub = store.save(model, tokenizer, version, "full", state_dict=state)
        by_files = {u: pusher.push_one(u, pub, attempts=1) for u in urls if outcomes.get(u) != "ok"}
        line = {"version": version, "joined": joined, "road": road, "broadcast": outcomes, "files": by_files}
        print(json.dumps({**line, "broadcast_s": round(broadcast_s, 3)}), flush=True)
    broadcaster.close()


if __name__ == "__main__":
    main()
