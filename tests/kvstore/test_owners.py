"""Tests for Owners: epochs per owner id, zombie refusal, leases with an injected clock, the
kvstore's own stalls, and the records that outlive a kvstore process."""

from __future__ import annotations

import pytest

from zerolayer.common.errors import FailedPrecondition, InvalidArgument
from zerolayer.kv.owner import (
    DEFAULT_OWNER,
    EPOCH_STALE,
    LEASE_EXPIRED,
    NOT_REGISTERED,
    OwnerRef,
    Registration,
)
from zerolayer.kvstore.owners import Owner, OwnerRecord, Owners
from zerolayer.kvstore.refusals import EpochStale, LeaseExpired, NotRegistered

LEASE_S = 3.0


class Clock:
    """Seconds, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_table(
    clock: Clock, records: dict[str, OwnerRecord] | None = None, saved: list | None = None
) -> Owners:
    on_change = None if saved is None else saved.append
    return Owners(LEASE_S, clock, records, on_change)


def registered(table: Owners, owner_id: str) -> Owner:
    """Registers ``owner_id``; returns its registration as the table keeps it."""
    return table.check(OwnerRef(owner_id, table.register(owner_id).epoch))


def advance(table: Owners, clock: Clock, seconds: float, step: float = 0.5) -> list[str]:
    """Moves the clock by ``seconds`` with a sweep every ``step`` (as the kvstore's loop does);
    returns the ids whose lease expired, in order."""
    expired = []
    for _ in range(round(seconds / step)):
        clock.now += step
        expired += [owner.owner_id for owner in table.sweep()]
    return expired


def test_each_registration_of_an_id_gets_the_next_epoch() -> None:
    table = make_table(Clock())
    assert table.register("a") == Registration(1, LEASE_S)
    assert table.register("b").epoch == 1
    assert table.register("a") == Registration(2, LEASE_S)
    assert [(o.owner_id, o.epoch) for o in table.owners] == [("a", 2), ("b", 1)]


def test_the_default_owner_does_not_register() -> None:
    table = make_table(Clock())
    with pytest.raises(InvalidArgument, match="^owner_id: empty; the default owner does not"):
        table.register("")
    owner = table.check(DEFAULT_OWNER)
    assert (owner.owner_id, owner.epoch, owner.expires_at) == ("", 0, None)


def test_a_call_of_an_older_epoch_is_refused_naming_owner_and_epochs() -> None:
    table = make_table(Clock())
    table.register("a")
    table.register("a")
    with pytest.raises(EpochStale) as info:
        table.check(OwnerRef("a", 1))
    assert str(info.value) == (
        "owner 'a' epoch 1: refused: the current epoch of owner 'a' is 2 (a newer registration "
        "replaced this one)"
    )
    assert isinstance(info.value, FailedPrecondition) and info.value.reason == EPOCH_STALE
    with pytest.raises(EpochStale):
        table.keep_alive(OwnerRef("a", 1))
    assert table.check(OwnerRef("a", 2)).epoch == 2


def test_an_unknown_owner_is_not_registered() -> None:
    table = make_table(Clock())
    with pytest.raises(NotRegistered) as info:
        table.check(OwnerRef("a", 4))
    assert str(info.value) == (
        "owner 'a' epoch 4: not registered with this kvstore (it restarted); register again and "
        "reconcile"
    )
    assert info.value.reason == NOT_REGISTERED


def test_a_lease_lapses_one_lease_after_the_last_keep_alive() -> None:
    clock = Clock()
    table = make_table(clock)
    a = registered(table, "a").ref
    table.register("b")
    assert advance(table, clock, 2.5) == []
    assert table.keep_alive(a) == LEASE_S  # at 102.5: a's lease now ends at 105.5, b's at 103.0
    assert advance(table, clock, 0.5) == ["b"]
    assert advance(table, clock, 2.0) == []
    assert advance(table, clock, 0.5) == ["a"]
    assert [(o.owner_id, o.lease_expired, o.expires_at) for o in table.owners] == [
        ("a", True, 105.5),
        ("b", True, 103.0),
    ]


def test_an_owner_back_after_its_lease_expired_is_told_and_registers_again() -> None:
    clock = Clock()
    table = make_table(clock)
    a = registered(table, "a").ref
    assert advance(table, clock, 3.0) == ["a"]
    for call in (table.check, table.keep_alive):
        with pytest.raises(LeaseExpired) as info:
            call(a)
        assert str(info.value) == (
            "owner 'a' epoch 1: lease expired; its block references were released, register again"
        )
        assert info.value.reason == LEASE_EXPIRED
    again = registered(table, "a")
    assert (again.epoch, again.lease_expired, again.expires_at) == (2, False, 106.0)
    assert [o.owner_id for o in table.live_owners] == ["a"]


def test_the_default_owner_never_expires() -> None:
    clock = Clock()
    table = make_table(clock)
    table.check(DEFAULT_OWNER)
    assert advance(table, clock, 60.0, step=1.0) == []
    assert table.check(DEFAULT_OWNER).lease_expired is False


def test_a_stall_of_the_kvstore_itself_extends_every_lease() -> None:
    clock = Clock()
    table = make_table(clock)
    table.register("a")
    assert advance(table, clock, 1.0) == []
    # The kvstore was stopped for 10 s: no keep-alive could arrive meanwhile.
    assert advance(table, clock, 10.0, step=10.0) == []
    assert table.owners[0].expires_at == 113.0
    assert advance(table, clock, 1.5) == []
    assert advance(table, clock, 0.5) == ["a"]


def test_records_carry_epochs_and_releases_to_the_next_kvstore_process() -> None:
    clock = Clock()
    saved: list[dict[str, OwnerRecord]] = []
    table = make_table(clock, saved=saved)
    table.register("a")
    table.register("a")
    table.register("b")
    assert advance(table, clock, 3.0) == ["a", "b"]
    table.register("b")
    assert saved[-1] == {"a": OwnerRecord(2, released=True), "b": OwnerRecord(2)}
    assert len(saved) == 6  # 4 registrations, 2 expiries

    restarted = make_table(Clock(), records=saved[-1])
    with pytest.raises(EpochStale, match="current epoch of owner 'a' is 2"):
        restarted.check(OwnerRef("a", 1))
    with pytest.raises(LeaseExpired):
        restarted.check(OwnerRef("a", 2))
    with pytest.raises(NotRegistered):
        restarted.check(OwnerRef("b", 2))
    with pytest.raises(EpochStale, match="current epoch of owner 'b' is 2"):
        restarted.check(OwnerRef("b", 1))
    assert restarted.register("b").epoch == 3
    assert restarted.register("c").epoch == 1


def test_release_ends_the_lease_at_once() -> None:
    clock = Clock()
    table = make_table(clock)
    owner = registered(table, "a")
    clock.now += 1.0
    table.release(owner)
    assert (owner.lease_expired, owner.expires_at) == (True, 101.0)
    with pytest.raises(LeaseExpired):
        table.check(owner.ref)
    assert advance(table, clock, 5.0) == []


@pytest.mark.parametrize("lease_s", [0.0, -1.0])
def test_the_lease_must_be_positive(lease_s: float) -> None:
    with pytest.raises(ValueError, match="^lease_s: must be > 0$"):
        Owners(lease_s)
