"""The supervisor's takeover decisions, on a stack whose processes and probes are fakes."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

import zerolayer.stack.supervisor as supervisor
from zerolayer.stack.launcher import Stack, StackConfig
from zerolayer.stack.supervisor import Supervisor


class FakeProcess:
    """A ``Popen`` as the supervisor sees it: a pid, and a return code once it exited."""

    def __init__(self, pid: int, returncode: int | None = None) -> None:
        self.pid = pid
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


class Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


class FakeSchedulers:
    """``activate_scheduler`` and ``is_serving`` of the supervisor: schedulers whose address is in
    :attr:`starting` do not answer yet."""

    def __init__(self) -> None:
        self.starting: set[str] = set()
        self.activated: list[str] = []
        """Every address ``Activate`` was called on, answered or not."""

    def activate(self, address: str) -> None:
        self.activated.append(address)
        if address in self.starting:
            raise Unavailable()

    def is_serving(self, address: str, *args: object) -> bool:
        return address not in self.starting


@pytest.fixture
def schedulers(monkeypatch: pytest.MonkeyPatch) -> FakeSchedulers:
    fake = FakeSchedulers()
    monkeypatch.setattr(supervisor, "activate_scheduler", fake.activate)
    monkeypatch.setattr(supervisor, "is_serving", fake.is_serving)
    return fake


def make_stack(run_dir: Path) -> Stack:
    """One active scheduler and one standby, never started: every process a live fake."""
    stack = Stack(StackConfig(model_dir="/m", run_dir=str(run_dir), standby_schedulers=1))
    stack.processes = {name: FakeProcess(pid) for pid, name in enumerate(stack.slots, 100)}
    return stack


def second_death(stack: Stack, schedulers: FakeSchedulers) -> Supervisor:
    """``scheduler`` died and ``scheduler-1`` took over; ``scheduler`` restarted as the standby
    and is still starting; now ``scheduler-1`` dies too, and the supervisor has seen it."""
    stack.standby = {"scheduler"}
    stack.processes["scheduler"] = FakeProcess(200)
    stack.processes["scheduler-1"] = FakeProcess(101, returncode=-9)
    schedulers.starting.add(stack.address("scheduler"))
    watch = Supervisor(stack)
    watch._check_exit("scheduler-1")
    return watch


def test_a_takeover_activates_a_warmed_standby_and_the_dead_slot_restarts_as_standby(
    tmp_path: Path, schedulers: FakeSchedulers
) -> None:
    stack = make_stack(tmp_path)
    stack.processes["scheduler"] = FakeProcess(100, returncode=-9)
    watch = Supervisor(stack)
    watch._check_exit("scheduler")
    assert schedulers.activated == [stack.address("scheduler-1")]
    assert stack.standby == {"scheduler"}
    assert "--standby" in stack.command("scheduler")
    assert watch._slots["scheduler"].restart_at is not None


def test_a_standby_still_starting_takes_over_once_it_serves(
    tmp_path: Path, schedulers: FakeSchedulers
) -> None:
    stack = make_stack(tmp_path)
    watch = second_death(stack, schedulers)
    # the dead slot comes back as the standby: still one active scheduler, not two
    assert stack.standby == {"scheduler-1"}
    assert "--standby" in stack.command("scheduler-1")
    assert watch._slots["scheduler-1"].restart_at is not None
    assert schedulers.activated == [stack.address("scheduler")]

    watch._activate_ready()  # not serving yet: not tried again
    assert schedulers.activated == [stack.address("scheduler")]

    schedulers.starting.clear()
    watch._back.put("scheduler")  # its wait-scheduler thread saw it SERVING on ""
    watch._activate_ready()
    assert schedulers.activated == [stack.address("scheduler")] * 2
    watch._activate_ready()  # activated once
    assert schedulers.activated == [stack.address("scheduler")] * 2


def test_an_activation_that_fails_after_the_standby_serves_is_retried(
    tmp_path: Path, schedulers: FakeSchedulers
) -> None:
    stack = make_stack(tmp_path)
    watch = second_death(stack, schedulers)
    watch._back.put("scheduler")
    watch._activate_ready()  # serves on "" but does not answer Activate yet
    schedulers.starting.clear()
    watch._activate_ready()
    assert schedulers.activated == [stack.address("scheduler")] * 3
    watch._activate_ready()
    assert len(schedulers.activated) == 3


def test_a_standby_that_dies_before_it_was_activated_hands_the_role_on(
    tmp_path: Path, schedulers: FakeSchedulers
) -> None:
    stack = make_stack(tmp_path)
    watch = second_death(stack, schedulers)
    stack.processes["scheduler-1"] = FakeProcess(300)  # restarted as the standby, starting
    schedulers.starting.add(stack.address("scheduler-1"))
    stack.processes["scheduler"] = FakeProcess(200, returncode=-9)
    watch._check_exit("scheduler")
    assert stack.standby == {"scheduler"}
    schedulers.starting.clear()
    watch._back.put("scheduler")  # an event of the dead process: not activated
    watch._back.put("scheduler-1")
    watch._activate_ready()
    assert schedulers.activated[-1] == stack.address("scheduler-1")
    assert schedulers.activated.count(stack.address("scheduler")) == 1
