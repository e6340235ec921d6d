"""The stored responses of /v1/responses (zerolayer.frontend.responses.store): bounded in number
(the oldest dropped first) and age, each its tenant's alone, every drop told with its reason."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from zerolayer.frontend.responses.store import (
    DropReason,
    ResponseNotFound,
    ResponseStore,
    StoredResponse,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_store(max_responses: int = 3, max_age_s: float = 60.0):
    """A store on a clock the test moves, and the list of its drops."""
    clock, dropped = Clock(), []
    store = ResponseStore(
        max_responses,
        max_age_s,
        on_drop=lambda e, r: dropped.append((e.response_id, r)),
        clock=clock,
    )
    return store, clock, dropped


def entry(store: ResponseStore, response_id: str, tenant: str = "a") -> StoredResponse:
    return StoredResponse(response_id, tenant, {"id": response_id}, (), (), store.now())


def test_past_its_max_count_the_store_drops_the_oldest_first() -> None:
    store, _, dropped = make_store(max_responses=2)
    for response_id in ("resp_1", "resp_2", "resp_3"):
        store.put(entry(store, response_id))
    assert dropped == [("resp_1", DropReason.EVICTED)]
    assert len(store) == 2
    with pytest.raises(ResponseNotFound):
        store.get("a", "resp_1")
    assert store.get("a", "resp_3").body == {"id": "resp_3"}


def test_an_entry_older_than_the_max_age_is_dropped() -> None:
    store, clock, dropped = make_store(max_age_s=60)
    store.put(entry(store, "resp_old"))
    clock.now += 30
    store.put(entry(store, "resp_new"))
    clock.now += 30  # resp_old is exactly 60 s old: still kept
    assert store.get("a", "resp_old").response_id == "resp_old"
    clock.now += 0.5
    with pytest.raises(ResponseNotFound):
        store.get("a", "resp_old")
    assert dropped == [("resp_old", DropReason.EXPIRED)]
    assert len(store) == 1


def test_another_tenants_entry_is_not_found_like_a_missing_one() -> None:
    store, _, _ = make_store()
    store.put(entry(store, "resp_1", tenant="a"))
    with pytest.raises(ResponseNotFound) as other:
        store.get("b", "resp_1", "previous_response_id")
    with pytest.raises(ResponseNotFound) as missing:
        store.get("b", "resp_2", "previous_response_id")
    assert other.value.param == missing.value.param == "previous_response_id"
    assert str(other.value) == str(missing.value).replace("resp_2", "resp_1")
    with pytest.raises(ResponseNotFound):
        store.delete("b", "resp_1")
    assert store.get("a", "resp_1").tenant == "a"


def test_a_deleted_entry_is_gone_and_its_drop_told() -> None:
    store, _, dropped = make_store()
    store.put(entry(store, "resp_1"))
    assert store.delete("a", "resp_1").response_id == "resp_1"
    assert dropped == [("resp_1", DropReason.DELETED)]
    with pytest.raises(ResponseNotFound):
        store.get("a", "resp_1")
    with pytest.raises(ResponseNotFound):
        store.delete("a", "resp_1")


def test_a_dropped_entry_is_freed() -> None:
    store, _, dropped = make_store(max_responses=1)
    store.put(entry(store, "resp_1"))
    held = weakref.ref(store.get("a", "resp_1"))
    store.put(entry(store, "resp_2"))
    gc.collect()
    assert held() is None and dropped == [("resp_1", DropReason.EVICTED)]


def test_inside_an_event_loop_an_idle_store_drops_an_expired_entry_on_time() -> None:
    async def scenario() -> list:
        expired = asyncio.Event()
        dropped = []

        def on_drop(e: StoredResponse, reason: DropReason) -> None:
            dropped.append((e.response_id, reason))
            expired.set()

        store = ResponseStore(4, 0.05, on_drop=on_drop)
        store.put(entry(store, "resp_1"))
        await asyncio.wait_for(expired.wait(), timeout=10)
        return dropped

    assert asyncio.run(scenario()) == [("resp_1", DropReason.EXPIRED)]
