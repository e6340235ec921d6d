"""The processes of one stack: which layer each runs, its name, and its metrics port.

A stack runs one loader, one kvstore, ``schedulers + standby_schedulers`` schedulers and
``frontends`` frontends. Each process has a fixed *slot*: its name (``scheduler`` for the first
of a layer, ``scheduler-1``, ``scheduler-2`` ... for the others), which names its unix socket,
its log file and its metrics port for the whole life of the stack, across restarts. A
scheduler's role (active or standby) belongs to the process in the slot, not to the slot: after
a takeover, ``scheduler-1`` may be the active one and ``scheduler`` the new standby.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerolayer.common.settings import FRONTEND, KVSTORE, LAYERS, LOADER, SCHEDULER


@dataclass(frozen=True)
class Slot:
    """One process of the stack: a layer and its index among that layer's processes."""

    layer: str
    """"loader", "kvstore", "scheduler" or "frontend"."""
    index: int = 0
    """0 for the first process of the layer, 1, 2 ... for the others."""

    @property
    def name(self) -> str:
        """``<layer>`` for index 0, ``<layer>-<index>`` for the others."""
        return self.layer if self.index == 0 else f"{self.layer}-{self.index}"


def stack_slots(num_schedulers: int, num_frontends: int) -> tuple[Slot, ...]:
    """Every process of a stack in start order: loader, kvstore, the schedulers, the frontends
    (the stop order is the reverse).

    Args:
        num_schedulers: scheduler processes, active and standby (>= 1).
        num_frontends: frontend processes (>= 1).
    """
    return (
        Slot(LOADER),
        Slot(KVSTORE),
        *(Slot(SCHEDULER, i) for i in range(num_schedulers)),
        *(Slot(FRONTEND, i) for i in range(num_frontends)),
    )


def metrics_ports(base: int, slots: tuple[Slot, ...]) -> dict[str, int]:
    """The Prometheus port of each slot, by name: the first process of each layer keeps the
    four-layer rule (loader ``base``, kvstore ``base + 1``, scheduler ``base + 2``, frontend
    ``base + 3``), the others follow from ``base + 4`` in start order (schedulers, then
    frontends). ``base`` 0: every port 0 (off)."""
    if not base:
        return {slot.name: 0 for slot in slots}
    firsts = [slot for slot in slots if slot.index == 0]
    others = [slot for slot in slots if slot.index > 0]
    ports = {slot.name: base + LAYERS.index(slot.layer) for slot in firsts}
    ports |= {slot.name: base + len(LAYERS) + i for i, slot in enumerate(others)}
    return ports


def frontend_instance_id(stack_id: str, index: int) -> str:
    """The ``--instance-id`` of the stack's frontend ``index``: the stack's id for the first,
    ``<stack id>-<index>`` for the others (each reports its health under its own name)."""
    return stack_id if index == 0 else f"{stack_id}-{index}"
