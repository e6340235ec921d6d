"""The scheduler pool with scripted schedulers: routing, resubmission after a loss, the wait for a
scheduler, the poison rule, ids in flight."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator

import pytest
from factories import make_engine_request

from zerolayer.common.errors import InvalidArgument, SchedulerLost, Unavailable
from zerolayer.common.generation import EngineRequest, FinishReason, RequestOutput, SamplingParams
from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.frontend.routing import failover
from zerolayer.frontend.routing.router import Router
from zerolayer.frontend.routing.scheduler_client import SelfReport
from zerolayer.frontend.routing.scheduler_pool import SchedulerPool, Waits

A, B = "unix:/a.sock", "unix:/b.sock"


class ScriptedScheduler:
    """Answers each call with the next script: tokens, one per output, then ``end``: "finish",
    "lost" (SchedulerLost, carrying) or "unreachable" (SchedulerLost before anything)."""

    def __init__(
        self,
        *scripts: tuple[list[int], str],
        not_serving_reason: str = "",
        role: SchedulerRole | None = SchedulerRole.ACTIVE,
    ) -> None:
        self.scripts = list(scripts)
        self.requests: list[EngineRequest] = []
        self.num_watch_again = 0
        self.reason = not_serving_reason
        self.role = role
        """None: GetStats does not answer."""

    async def generate(
        self, request: EngineRequest, timeout_s: float | None
    ) -> AsyncIterator[RequestOutput]:
        self.requests.append(request)
        token_ids, end = self.scripts.pop(0)
        if end == "unreachable":
            raise SchedulerLost("scheduler x: failed to connect", carrying=False)
        for i, token_id in enumerate(token_ids):
            last = end == "finish" and i == len(token_ids) - 1
            reason = FinishReason.LENGTH if last else FinishReason.UNSPECIFIED
            cached = 16 if len(self.requests) == 1 else 0
            yield RequestOutput(request.request_id, (token_id,), reason, 99, cached)
            await asyncio.sleep(0)
        if end == "lost":
            raise SchedulerLost("scheduler x: Socket closed", carrying=True)

    def watch_again(self) -> None:
        self.num_watch_again += 1

    async def self_report(self) -> SelfReport | None:
        return None if self.role is None else SelfReport(self.role, self.reason)

    async def block_size(self, timeout_s: float = 5.0) -> int:
        return 0 if self.role is None else 16

    async def close(self) -> None:
        pass


def make_pool(schedulers: dict[str, ScriptedScheduler], *active: str) -> SchedulerPool:
    router = Router(tuple(schedulers))
    for address in active:
        router.set_health(address, active=True, warm=True)
    return SchedulerPool(schedulers, router, Waits(0.2, 1.0), draw=lambda: 1234)


async def run(pool: SchedulerPool, request: EngineRequest) -> list[RequestOutput]:
    return [o async for o in pool.generate(request, timeout_s=10, max_model_len=64)]


def test_a_stream_continues_on_another_scheduler_without_a_gap_or_repeat() -> None:
    a = ScriptedScheduler(([7, 8], "lost"))
    b = ScriptedScheduler(([9, 10, 11], "finish"))
    pool = make_pool({A: a, B: b}, A, B)
    request = make_engine_request(max_new_tokens=5, sampling=SamplingParams(temperature=0.7))
    outputs = asyncio.run(run(pool, request))
    assert [o.new_token_ids for o in outputs] == [(7,), (8,), (9,), (10,), (11,)]
    assert {(o.request_id, o.num_prompt_tokens, o.num_cached_tokens) for o in outputs} == {
        ("r1", 3, 16)
    }
    assert outputs[-1].finish_reason == FinishReason.LENGTH
    (first,), (second,) = a.requests, b.requests
    assert first.sampling.seed == second.sampling.seed == 1234  # drawn once, sent both times
    assert (second.prompt_token_ids, second.max_new_tokens) == ((1, 2, 3, 7, 8), 3)
    assert re.fullmatch("r1~[0-9a-f]{32}", second.request_id)
    assert (pool.router.states[A].active, a.num_watch_again) == (False, 1)
    assert [s.num_outstanding_tokens for s in pool.router.states.values()] == [0, 0]


def test_a_stream_waits_for_the_restarted_scheduler_when_it_was_the_only_one() -> None:
    a = ScriptedScheduler(([7], "lost"), ([8, 9], "finish"))
    pool = make_pool({A: a}, A)

    async def restart_later() -> list[RequestOutput]:
        generation = asyncio.create_task(run(pool, make_engine_request(max_new_tokens=3)))
        await asyncio.sleep(0.3)  # longer than a new request would wait
        assert not generation.done()
        pool.router.set_health(A, active=True, warm=True)
        return await generation

    outputs = asyncio.run(restart_later())
    assert [t for o in outputs for t in o.new_token_ids] == [7, 8, 9]
    assert a.requests[1].prompt_token_ids == (1, 2, 3, 7)


async def restarted_later(pool: SchedulerPool, address: str) -> list[int]:
    """The tokens a request gets when ``address`` comes back 0.1 s after it started (every
    scheduler having died under it meanwhile); raises what the request ends with."""
    generation = asyncio.create_task(run(pool, make_engine_request(max_new_tokens=5)))
    await asyncio.sleep(0.1)
    pool.router.set_health(address, active=True, warm=True)
    return [t for o in await generation for t in o.new_token_ids]


def test_two_schedulers_dying_together_cost_one_incident(caplog) -> None:
    a = ScriptedScheduler(([7], "lost"), ([8, 9, 10, 11], "finish"))
    b = ScriptedScheduler(([], "lost"))  # resubmitted to it as it was dying too
    pool = make_pool({A: a, B: b}, A, B)
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(restarted_later(pool, A)) == [7, 8, 9, 10, 11]
    assert [r.getMessage().endswith("; resubmitting") for r in caplog.records] == [True, True]


def test_a_poison_request_ends_with_one_error_after_three_deaths_at_most(caplog) -> None:
    a = ScriptedScheduler(([7], "lost"), ([], "lost"))
    b = ScriptedScheduler(([], "lost"))
    pool = make_pool({A: a, B: b}, A, B)
    with caplog.at_level(logging.WARNING), pytest.raises(Unavailable) as info:
        asyncio.run(restarted_later(pool, A))
    assert str(info.value) == (
        "scheduler: request 'r1' was in flight on 3 schedulers that died in 2 separate "
        "incidents; it is not retried (it may be what killed them)"
    )
    *resubmitted, verdict = caplog.records
    assert len(resubmitted) == 2
    assert (verdict.levelno, verdict.getMessage()) == (
        logging.WARNING,
        f"request r1: scheduler x: Socket closed; given up as poison: {info.value}",
    )
    assert not pool.router.available  # both are left to their health streams


def test_a_request_lost_in_two_separate_incidents_ends_with_one_error(monkeypatch) -> None:
    monkeypatch.setattr(failover, "INCIDENT_WINDOW_S", -1.0)  # no two losses are one incident
    a = ScriptedScheduler(([7], "lost"))
    b = ScriptedScheduler(([], "lost"))
    pool = make_pool({A: a, B: b}, A, B)

    async def poison() -> list[int]:
        received = []
        with pytest.raises(Unavailable) as info:
            async for o in pool.generate(
                make_engine_request(max_new_tokens=5), timeout_s=10, max_model_len=64
            ):
                received.extend(o.new_token_ids)
        assert "was in flight on 2 schedulers that died in 2 separate incidents" in str(info.value)
        return received

    assert asyncio.run(poison()) == [7]


def test_a_scheduler_that_was_never_reached_costs_no_loss() -> None:
    a = ScriptedScheduler(([], "unreachable"))
    b = ScriptedScheduler(([5], "finish"))
    pool = make_pool({A: a, B: b}, A, B)
    outputs = asyncio.run(run(pool, make_engine_request(max_new_tokens=1)))
    assert [o.new_token_ids for o in outputs] == [(5,)]
    assert re.fullmatch("r1~[0-9a-f]{32}", b.requests[0].request_id)


def test_no_scheduler_is_unavailable_after_the_new_request_wait() -> None:
    pool = make_pool({A: ScriptedScheduler()})
    with pytest.raises(Unavailable, match="^scheduler: none can take requests"):
        asyncio.run(run(pool, make_engine_request(max_new_tokens=5)))


def test_no_scheduler_is_unavailable_with_the_reasons_the_schedulers_gave() -> None:
    xid = "GPU fatal event: Xid 79 (GPU has fallen off the bus)"
    schedulers = {
        A: ScriptedScheduler(not_serving_reason=xid),
        B: ScriptedScheduler(not_serving_reason=xid),
    }
    pool = make_pool(schedulers)
    with pytest.raises(Unavailable) as refused:
        asyncio.run(run(pool, make_engine_request(max_new_tokens=5)))
    assert str(refused.value).startswith("scheduler: none can take requests")
    assert str(refused.value).endswith(f"): {xid}")  # said once, not once per scheduler


def test_no_scheduler_is_unavailable_without_addresses_or_paths_and_logs_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    schedulers = {
        A: ScriptedScheduler(not_serving_reason="GPU fatal event: Xid 79 on /dev/nvidia0"),
        B: ScriptedScheduler(),
    }
    pool = make_pool(schedulers)
    with pytest.raises(Unavailable) as refused:
        asyncio.run(run(pool, make_engine_request(max_new_tokens=5)))
    assert str(refused.value) == (
        "scheduler: none can take requests (#0 down or starting; #1 down or starting): "
        "GPU fatal event: Xid 79 on <internal>"
    )
    assert f"{A}: down or starting; {B}: down or starting" in caplog.text


def test_a_request_id_in_flight_is_refused() -> None:
    a = ScriptedScheduler(([7, 8], "finish"))
    pool = make_pool({A: a}, A)

    async def twice() -> None:
        first = pool.generate(make_engine_request(max_new_tokens=5), timeout_s=10, max_model_len=64)
        await anext(first)
        with pytest.raises(InvalidArgument, match="^request_id: 'r1' is in flight$"):
            await anext(
                pool.generate(make_engine_request(max_new_tokens=5), timeout_s=10, max_model_len=64)
            )
        await first.aclose()
        assert pool.router.states[A].num_requests == 0

    asyncio.run(twice())


def test_request_ids_are_unique_per_tenant_and_never_meet_in_the_scheduler() -> None:
    a = ScriptedScheduler(([7, 8], "finish"), ([9], "finish"), ([5], "finish"))
    pool = make_pool({A: a}, A)

    async def two_tenants() -> None:
        owner = pool.generate(
            make_engine_request(max_new_tokens=5), timeout_s=10, max_model_len=64, tenant="a"
        )
        await anext(owner)
        # another tenant's id in flight neither refuses nor is told of
        other = await run_for(pool, make_engine_request(max_new_tokens=5), "b")
        assert [o.request_id for o in other] == ["r1"]
        with pytest.raises(InvalidArgument, match="^request_id: 'r1' is in flight$"):
            await anext(
                pool.generate(
                    make_engine_request(max_new_tokens=5),
                    timeout_s=10,
                    max_model_len=64,
                    tenant="a",
                )
            )
        assert [o.request_id async for o in owner] == ["r1"]
        assert [
            o.request_id for o in await run_for(pool, make_engine_request(max_new_tokens=5), "")
        ] == ["r1"]

    asyncio.run(two_tenants())
    owner_id, other_id, untenanted_id = (r.request_id for r in a.requests)
    assert re.fullmatch("r1~[0-9a-f]{32}", owner_id)
    assert re.fullmatch("r1~[0-9a-f]{32}", other_id)
    assert owner_id != other_id
    assert untenanted_id == "r1"


async def run_for(pool: SchedulerPool, request: EngineRequest, tenant: str) -> list[RequestOutput]:
    return [o async for o in pool.generate(request, 10, max_model_len=64, tenant=tenant)]


def test_schedulers_are_described_by_what_they_say_of_themselves(caplog) -> None:
    kvstore = "kvstore: unusable for more than 3 s (UNAVAILABLE)"
    schedulers = {
        A: ScriptedScheduler(not_serving_reason=kvstore),  # active, its kvstore down
        B: ScriptedScheduler(role=SchedulerRole.STANDBY),
    }
    pool = make_pool(schedulers)
    for address in (A, B):
        pool.router.set_health(address, active=False, warm=True)
    with caplog.at_level(logging.WARNING), pytest.raises(Unavailable) as refused:
        asyncio.run(run(pool, make_engine_request(max_new_tokens=5)))
    assert str(refused.value) == (
        f"scheduler: none can take requests (#0 not serving; #1 standby): {kvstore}"
    )
    assert caplog.messages == [f"no scheduler can take a request: {A}: not serving; {B}: standby"]
    # the block size is the schedulers' even while none can take requests
    assert asyncio.run(pool.block_size()) == 16
    schedulers[A].role = schedulers[B].role = None  # GetStats does not answer
    assert asyncio.run(pool.block_size()) == 0


def token_of(seed: int, position: int) -> int:
    """What the seeded scheduler below draws at ``position`` with ``seed``."""
    return seed % 97 * 1000 + position


class SeededScheduler:
    """Draws ``token_of(seed + i, position)`` for sample i of each request (as a scheduler's
    (seed, position) sampler would); sample 1 of an n > 1 request ends with EOS at its second
    token; it dies (carrying) before step ``die_at`` if set."""

    def __init__(self, die_at: int | None = None) -> None:
        self.die_at = die_at
        self.requests: list[EngineRequest] = []

    async def generate(
        self, request: EngineRequest, timeout_s: float | None
    ) -> AsyncIterator[RequestOutput]:
        self.requests.append(request)
        num_prompt = len(request.prompt_token_ids)
        done: set[int] = set()
        for step in range(request.max_new_tokens):
            if step == self.die_at:
                raise SchedulerLost("scheduler x: Socket closed", carrying=True)
            for i in sorted(set(range(request.n)) - done):
                token_id = token_of(request.sampling.seed + i, num_prompt + step)
                reason = FinishReason.UNSPECIFIED
                if step == request.max_new_tokens - 1:
                    reason = FinishReason.LENGTH
                elif request.n > 1 and i == 1 and step == 1:
                    reason = FinishReason.EOS
                    done.add(i)
                yield RequestOutput(request.request_id, (token_id,), reason, 99, 0, index=i)
            await asyncio.sleep(0)

    def watch_again(self) -> None:
        pass

    async def close(self) -> None:
        pass


def test_the_samples_of_a_lost_request_go_on_one_by_one_with_their_seeds() -> None:
    a, b = SeededScheduler(die_at=3), SeededScheduler()
    pool = make_pool({A: a, B: b}, A, B)  # type: ignore[dict-item]
    request = make_engine_request(max_new_tokens=6, sampling=SamplingParams(temperature=0.7), n=3)
    outputs = asyncio.run(run(pool, request))
    by_index = {i: [t for o in outputs if o.index == i for t in o.new_token_ids] for i in range(3)}
    assert by_index == {
        0: [token_of(1234, 3 + p) for p in range(6)],
        1: [token_of(1235, 3), token_of(1235, 4)],  # it had ended (EOS): not resubmitted
        2: [token_of(1236, 3 + p) for p in range(6)],
    }
    assert [o.finish_reason for o in outputs if o.finished] == [FinishReason.EOS] + [
        FinishReason.LENGTH
    ] * 2
    assert [(r.n, r.sampling.seed, r.prompt_token_ids, r.max_new_tokens) for r in b.requests] == [
        (1, 1234, (1, 2, 3, *by_index[0][:3]), 3),
        (1, 1236, (1, 2, 3, *by_index[2][:3]), 3),
    ]
    assert {o.request_id for o in outputs} == {"r1"}
    assert [s.num_outstanding_tokens for s in pool.router.states.values()] == [0, 0]
