"""The processes of a stack: names in start order, metrics ports, frontend instance ids, and the
range of ``--metrics-port-base`` that follows from them."""

from __future__ import annotations

import pytest

from zerolayer.stack.config import StackConfig
from zerolayer.stack.layout import Slot, frontend_instance_id, metrics_ports, stack_slots


def test_the_processes_in_start_order() -> None:
    slots = stack_slots(3, 2)
    assert [slot.name for slot in slots] == [
        "loader",
        "kvstore",
        "scheduler",
        "scheduler-1",
        "scheduler-2",
        "frontend",
        "frontend-1",
    ]
    assert slots[3] == Slot("scheduler", 1)


def test_the_first_four_keep_their_ports_and_the_others_follow() -> None:
    assert metrics_ports(9100, stack_slots(1, 1)) == {
        "loader": 9100,
        "kvstore": 9101,
        "scheduler": 9102,
        "frontend": 9103,
    }
    assert metrics_ports(9100, stack_slots(3, 2)) == {
        "loader": 9100,
        "kvstore": 9101,
        "scheduler": 9102,
        "frontend": 9103,
        "scheduler-1": 9104,
        "scheduler-2": 9105,
        "frontend-1": 9106,
    }
    assert set(metrics_ports(0, stack_slots(2, 2)).values()) == {0}


def test_standby_schedulers_are_slots_after_the_active_ones() -> None:
    config = StackConfig(model_dir="/m", schedulers=2, standby_schedulers=1, frontends=1)
    assert [slot.name for slot in config.slots][2:] == [
        "scheduler",
        "scheduler-1",
        "scheduler-2",
        "frontend",
    ]
    assert config.metrics_port("scheduler-2") == 0


@pytest.mark.parametrize(
    ("counts", "highest"),
    [({}, 65532), ({"schedulers": 2}, 65531), ({"standby_schedulers": 2, "frontends": 3}, 65528)],
)
def test_the_metrics_port_base_leaves_a_port_for_every_process(
    counts: dict[str, int], highest: int
) -> None:
    assert (
        StackConfig(model_dir="/m", metrics_port_base=highest, **counts).metrics_port("frontend")
        == highest + 3
    )
    with pytest.raises(ValueError) as info:
        StackConfig(model_dir="/m", metrics_port_base=highest + 1, **counts)
    assert str(info.value) == f"--metrics-port-base: must be in 1..{highest} (or 0: off)"


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("schedulers", 0, "--schedulers: must be > 0"),
        ("standby_schedulers", -1, "--standby-schedulers: must be >= 0"),
        ("frontends", 0, "--frontends: must be > 0"),
        ("schedulers", 65, "--schedulers: must be at most 64"),
        ("standby_schedulers", 65, "--standby-schedulers: must be at most 64"),
        ("frontends", 100000, "--frontends: must be at most 64"),
    ],
)
def test_the_process_counts_are_checked(field: str, bad: int, message: str) -> None:
    with pytest.raises(ValueError) as info:
        StackConfig(model_dir="/m", **{field: bad})
    assert str(info.value) == message


def test_each_frontend_has_its_own_instance_id() -> None:
    assert [frontend_instance_id("zerolayer-x1", i) for i in range(3)] == [
        "zerolayer-x1",
        "zerolayer-x1-1",
        "zerolayer-x1-2",
    ]
