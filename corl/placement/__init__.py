"""Devices on one node: ``corl plan`` and ``corl run`` turn the config's ``gpus:`` and ``placement:``
and the node's GPUs into a device plan (``plan``), which every process ``corl run`` starts follows
(``CUDA_VISIBLE_DEVICES``), and which compose's ``gpu`` profile can follow (``compose``)."""

from .node import NodeError, node_devices
from .plan import VISIBLE, Plan, Slot, plan

__all__ = ["VISIBLE", "NodeError", "Plan", "Slot", "node_devices", "plan"]
