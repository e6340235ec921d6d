"""The router: least outstanding work, health transitions, a standby excluded, waiting for a
scheduler, prefix-affine choices."""

from __future__ import annotations

import asyncio

import pytest

from zerolayer.common.errors import Unavailable
from zerolayer.frontend.routing.router import (
    AFFINITY_SLACK_TOKENS,
    LEAST_WORK,
    PREFIX_AFFINE,
    Router,
)

A, B, C = "unix:/a.sock", "unix:/b.sock", "unix:/c.sock"


def make_router(*active: str, policy: str = LEAST_WORK, addresses=(A, B, C)) -> Router:
    """A router over ``addresses`` whose ``active`` schedulers are SERVING on both names."""
    router = Router(addresses, policy)
    for address in active:
        router.set_health(address, active=True, warm=True)
    return router


def test_the_least_busy_scheduler_gets_the_request_and_ties_go_round_robin() -> None:
    router = make_router(A, B, C)
    assert [router.pick() for _ in range(4)] == [A, B, C, A]
    with router.working(A, 100), router.working(B, 30) as work:
        assert [router.pick() for _ in range(3)] == [C, C, C]
        with router.working(C, 50):
            assert router.pick() == B
            work.set(60)  # B's request advanced: 60 tokens ahead of it now, more than C's 50
            assert router.pick() == C
        assert (router.states[B].num_outstanding_tokens, router.states[B].num_requests) == (60, 1)
    assert [s.num_outstanding_tokens for s in router.states.values()] == [0, 0, 0]
    assert [s.num_requests for s in router.states.values()] == [0, 0, 0]


def test_only_serving_schedulers_get_requests_as_their_health_changes() -> None:
    changes = []
    router = Router((A, B), on_change=lambda: changes.append(router.available))
    assert (router.available, router.pick()) == (False, None)
    router.set_health(B, warm=True, active=True)
    assert (router.available, router.pick(), router.pick()) == (True, B, B)
    router.set_health(A, active=True, warm=True)
    router.set_health(B, active=False, warm=False)  # B died
    assert (router.pick(), router.pick()) == (A, A)
    router.set_health(A, active=False)  # A stopped serving, its process lives: a standby now
    assert (router.available, router.pick()) == (False, None)
    router.set_health(A, warm=False)
    assert (router.available, router.pick()) == (False, None)
    router.set_health(B, active=True, warm=True)  # B restarted
    assert (router.available, router.pick()) == (True, B)
    assert changes == [True, True, True, False, False, True]


def test_a_standby_takes_no_traffic_until_it_reports_serving_on_the_scheduler_service() -> None:
    router = Router((A, B))
    router.set_health(A, warm=True)  # a standby: SERVING on "", NOT_SERVING on the service name
    assert (router.available, router.pick()) == (False, None)
    assert router.describe() == "#0 standby; #1 down or starting"
    assert router.describe(by_address=True) == f"{A}: standby; {B}: down or starting"
    router.set_health(B, active=True, warm=True)
    with router.working(B, 500):
        assert [router.pick() for _ in range(3)] == [B, B, B]  # however busy, not the standby
    router.set_health(A, active=True)  # activated
    with router.working(B, 500):
        assert router.pick() == A
    assert router.describe() == "#0 serving; #1 serving"


def test_acquire_waits_for_a_scheduler_and_gives_up_after_its_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = Router((A, B))

    async def scheduler_comes_back() -> str:
        with pytest.raises(Unavailable) as info:
            await router.acquire(0.05)
        # NOTE: public clients read this: schedulers by index, their addresses only in the log.
        assert str(info.value) == (
            "scheduler: none can take requests (#0 down or starting; #1 down or starting)"
        )
        waiting = asyncio.create_task(router.acquire(5.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        router.set_health(B, active=True)
        return await asyncio.wait_for(waiting, 1.0)

    assert asyncio.run(scheduler_comes_back()) == B


def test_wait_available_returns_as_soon_as_a_scheduler_serves_or_false_at_its_timeout() -> None:
    router = Router((A, B))

    async def wait() -> tuple[bool, bool, bool]:
        timed_out = await router.wait_available(0.05)
        waiting = asyncio.create_task(router.wait_available(5.0))
        await asyncio.sleep(0.05)
        router.set_health(A, warm=True)  # a standby does not count
        await asyncio.sleep(0.05)
        pending = not waiting.done()
        router.set_health(A, active=True)
        return timed_out, pending, await asyncio.wait_for(waiting, 1.0)

    assert asyncio.run(wait()) == (False, True, True)


def test_prefix_affine_keeps_a_prefix_on_one_scheduler_unless_it_is_far_busier() -> None:
    router = make_router(A, B, C, policy=PREFIX_AFFINE)
    prompts = [[1, 7, i] for i in range(12)]
    chosen = {router.pick([*p, 99]) for p in prompts}
    assert len(chosen) > 1  # different prefixes spread over the schedulers
    prompt = [5] * 40
    home = router.pick(prompt)
    assert [router.pick([*prompt, i]) for i in range(3)] == [home] * 3  # 32 tokens decide
    assert router.pick(prompt, cache_salt="tenant") in (A, B, C)
    with router.working(home, AFFINITY_SLACK_TOKENS):
        assert router.pick(prompt) == home
    with router.working(home, AFFINITY_SLACK_TOKENS + 1):
        assert router.pick(prompt) != home


@pytest.mark.parametrize(
    ("addresses", "policy"), [((), LEAST_WORK), ((A, A), LEAST_WORK), ((A,), "random")]
)
def test_a_router_refuses_no_addresses_repeated_ones_and_unknown_policies(
    addresses, policy
) -> None:
    with pytest.raises(ValueError):
        Router(addresses, policy)
