"""The device plan of one node: which GPUs each process of a run sees. Pure: a config and the
node's device ids in, a plan out (no CUDA, no I/O).

Processes are named as ``corl run`` names its children: ``server-<member>-<replica>`` and
``trainer-<member>``. A *unit* is a set of processes that share one set of devices: each server
replica alone, each trainer alone, or, with ``placement.colocate``, a trained member's first server
and its trainer together.

1. Units whose members ask for GPUs (``gpus``, ``trainer.gpus``, a vLLM tensor-parallel size above
   1) get devices of their own, in config order; ``0`` runs on the CPU. Asking for more than the
   node has (or ``--gpus`` allows) is a problem the plan names, with what to change.
2. The other units share what is left: one device each while there are enough (a trainer group's
   ranks one each), else in turn, several units to a device; on a node without GPUs, or with none
   left, they run on the CPU.
3. A vLLM server on a GPU takes 0.9 of its memory, split among the vLLM servers there; where a
   trainer or a transformers server shares the GPU they take ``placement.server_memory_share``
   instead. A member's own ``vllm.gpu_memory_utilization`` wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from corl.config import CohortConfig, MemberConfig

ALONE_SHARE = 0.9  # what vLLM servers alone on a GPU take of its memory (the rest: CUDA context, activations)
VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Slot:
    """One process of the run and the devices it sees."""

    process: str  # the child's name in ``corl run``
    member: str
    role: Literal["server", "trainer"]
    devices: tuple[str, ...]  # device ids as the node names them; () runs on the CPU
    asked: int | None  # GPUs the config asks for (None: the planner's choice)
    backend: str = "transformers"  # servers: the member's backend
    processes: int = 1  # trainers: the group's ranks (torchrun --nproc-per-node)
    tensor_parallel: int = 1  # vLLM servers: GPUs the engine shards the model over
    memory_share: float | None = None  # vLLM servers on GPUs: gpu_memory_utilization set by the plan
    shared_with: tuple[str, ...] = ()  # other processes on the same devices

    @property
    def on_gpu(self) -> bool:
        return bool(self.devices)


@dataclass(frozen=True)
class Plan:
    """Every process's devices on a node of ``devices``; ``problems`` says why it cannot run as is."""

    devices: tuple[str, ...]  # the node's GPUs the plan may use
    slots: tuple[Slot, ...]
    needed: int  # GPUs the explicit asks add up to
    problems: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()  # what to change, when there are problems

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def used(self) -> list[str]:
        """The node's devices some process sees, in the node's order."""
        seen = {d for s in self.slots for d in s.devices}
        return [d for d in self.devices if d in seen]

    @property
    def places_gpus(self) -> bool:
        """Whether the plan has anything to say: the node has GPUs or the config asks for some."""
        return bool(self.devices) or self.needed > 0

    def slot(self, process: str) -> Slot:
        for s in self.slots:
            if s.process == process:
                return s
        raise KeyError(f"no process {process!r} in the plan; processes: {[s.process for s in self.slots]}")

    def env(self, process: str) -> dict[str, str]:
        """The environment the plan gives a child: the devices it sees (``CUDA_VISIBLE_DEVICES``; empty on
        the CPU of a node with GPUs, so it never lands on one by default). Nothing on a node without GPUs."""
        if not self.devices:
            return {}
        return {VISIBLE: ",".join(self.slot(process).devices)}

    def vllm_options(self, process: str) -> dict[str, float]:
        """Engine options the plan sets for a vLLM server (``gpu_memory_utilization``), else none."""
        share = self.slot(process).memory_share
        return {} if share is None else {"gpu_memory_utilization": share}


@dataclass
class _Unit:
    slots: list[Slot]
    want: int | None  # devices asked for; None: the planner's choice
    auto_want: int = 1  # devices a unit of the planner's choice takes when there are enough
    devices: tuple[str, ...] = field(default_factory=tuple)


def _server(m: MemberConfig, replica: int) -> Slot:
    tp = m.vllm.tensor_parallel_size if m.backend == "vllm" else 1
    return Slot(f"server-{m.name}-{replica}", m.name, "server", (), m.server_gpus(), m.backend, tensor_parallel=tp)


def _trainer(m: MemberConfig) -> Slot:
    return Slot(f"trainer-{m.name}", m.name, "trainer", (), m.trainer_gpus(), processes=m.trainer_processes)


def _need(slot: Slot) -> int:
    """Devices a process needs to itself when on GPUs: a server's tensor-parallel size, a group's ranks."""
    return slot.tensor_parallel if slot.role == "server" else slot.processes


def _units(cfg: CohortConfig) -> list[_Unit]:
    units: list[_Unit] = []
    for m in cfg.served_members():
        servers = [_server(m, i) for i in range(len(m.servers))]
        trainer = _trainer(m) if m.role == "trained" else None
        if trainer is not None and cfg.placement.colocate:
            first, *others = servers
            asks = [a for a in (first.asked, trainer.asked) if a is not None]
            want = max(asks) if asks else None
            units.append(_Unit([first, trainer], want, max(_need(first), _need(trainer))))
            units += [_Unit([s], s.asked, _need(s)) for s in others]
            continue
        units += [_Unit([s], s.asked, _need(s)) for s in servers]
        if trainer is not None:
            units.append(_Unit([trainer], trainer.asked, _need(trainer)))
    return units


def _own_devices(slot: Slot, unit: tuple[str, ...]) -> tuple[str, ...]:
    """The devices of its unit a process sees: what it asked for, else what it needs, else them all."""
    n = slot.asked if slot.asked is not None else _need(slot)
    return unit[: max(1, n)] if unit else ()


def plan(cfg: CohortConfig, devices: Sequence[str]) -> Plan:
    """The device plan of ``cfg``'s processes on a node whose GPUs are ``devices`` (ids as
    ``CUDA_VISIBLE_DEVICES`` names them)."""
    node = tuple(devices)
    units = _units(cfg)
    problems: list[str] = []
    # 1. Explicit asks: devices of their own, in config order.
    explicit = [u for u in units if u.want]
    needed = sum(u.want or 0 for u in explicit)
    free = list(node)
    for u in explicit:
        assert u.want is not None
        u.devices, free = tuple(free[: u.want]), free[u.want :]
        problems += [
            f"{s.process}: needs {_need(s)} GPUs at once (one per rank or shard), its GPUs are {u.want}"
            for s in u.slots
            if s.asked != 0 and _need(s) > u.want
        ]
    if needed > len(node):
        problems.insert(0, f"the plan needs {needed} GPUs; {_node_words(len(node))}")
    # 2. The planner's choice: what is left, one device per unit while there are enough, else in turn.
    auto = [u for u in units if u.want is None]
    if free:
        exclusive = sum(u.auto_want for u in auto) <= len(free)
        turn = 0
        for u in auto:
            if u.auto_want > len(free):
                names = ", ".join(s.process for s in u.slots)
                problems.append(f"{names}: needs {u.auto_want} GPUs at once, {len(free)} left to share")
                continue
            if exclusive:
                u.devices, free = tuple(free[: u.auto_want]), free[u.auto_want :]
            else:
                u.devices = tuple(free[(turn + i) % len(free)] for i in range(u.auto_want))
                turn += u.auto_want
    slots = _finish(cfg, units)
    hints = _hints(cfg, units, needed, len(node)) if problems else ()
    return Plan(node, slots, needed, tuple(problems), hints)


def _finish(cfg: CohortConfig, units: list[_Unit]) -> tuple[Slot, ...]:
    """Each process's own devices, who shares them, and a vLLM server's memory share."""
    placed = [replace(s, devices=_own_devices(s, u.devices) if s.asked != 0 else ()) for u in units for s in u.slots]
    on: dict[str, list[Slot]] = {}
    for s in placed:
        for d in s.devices:
            on.setdefault(d, []).append(s)
    out = []
    for s in placed:
        others = tuple(sorted({o.process for d in s.devices for o in on[d] if o.process != s.process}))
        share = None
        if s.role == "server" and s.backend == "vllm" and s.devices:
            if cfg.member(s.member).vllm.gpu_memory_utilization is None:
                share = min(_share(cfg, on[d]) for d in s.devices)
        out.append(replace(s, shared_with=others, memory_share=share))
    order = {name: i for i, name in enumerate(_start_order(cfg))}
    return tuple(sorted(out, key=lambda s: order[s.process]))


def _share(cfg: CohortConfig, there: list[Slot]) -> float:
    vllm = [s for s in there if s.role == "server" and s.backend == "vllm"]
    budget = ALONE_SHARE if len(vllm) == len(there) else cfg.placement.server_memory_share
    return math.floor(100 * budget / len(vllm)) / 100


def _start_order(cfg: CohortConfig) -> list[str]:
    """Processes in the order ``corl run`` starts them: every server, then every trainer."""
    served = cfg.served_members()
    servers = [f"server-{m.name}-{i}" for m in served for i in range(len(m.servers))]
    return servers + [f"trainer-{m.name}" for m in served if m.role == "trained"]


def _node_words(n: int) -> str:
    return f"the node has {n}" if n else "the node has none"


def _hints(cfg: CohortConfig, units: list[_Unit], needed: int, node: int) -> tuple[str, ...]:
    """What would make the plan fit, largest saving first."""
    hints = []
    if not cfg.placement.colocate and any(m.role == "trained" for m in cfg.served_members()):
        colocated = plan(cfg.model_copy(update={"placement": cfg.placement.model_copy(update={"colocate": True})}), [])
        if colocated.needed < needed:
            hints.append(
                f"placement: {{colocate: true}} runs each trainer on its server's GPUs: {colocated.needed} GPUs"
            )
    asks = [f"{'+'.join(s.process for s in u.slots)} {u.want}" for u in units if u.want]
    if asks:
        listed = ", ".join(asks[:8]) + (", ..." if len(asks) > 8 else "")
        hints.append(f"fewer GPUs per member (gpus:, trainer.gpus:; 0 runs on the CPU); asked now: {listed}")
    if node:
        hints.append(f"no gpus: asks: the planner then shares this node's {node} GPU(s) among every process")
    hints.append(f"a node with {needed} GPUs or more (this one: {node}; --gpus, when given, limits it)")
    return tuple(hints)
