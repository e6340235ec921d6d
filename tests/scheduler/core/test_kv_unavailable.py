"""The scheduler while the kvstore is unusable: requests that fit their blocks go on, the others
wait up to ``kv_unavailable_timeout_s`` and then end with UNAVAILABLE, and nothing leaks."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from factories import make_engine_request, make_scheduler

from zerolayer.common.errors import Unavailable
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.stats import PrefixHit, PrefixLookup
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.kv_cache_manager import (
    KVLeaseLost,
    KVStoreUnavailable,
)
from zerolayer.scheduler.core.scheduler import Scheduler

BLOCK_SIZE = 4
TIMEOUT_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class DownableAllocator:
    """A local pool whose every call fails with KVStoreUnavailable while ``down``."""

    def __init__(self, num_blocks: int, clock: Clock | None = None) -> None:
        self.local = LocalBlockAllocator(num_blocks, BLOCK_SIZE, enable_prefix_caching=False)
        self.num_blocks_total = num_blocks
        self.down = False
        self.hang_s = 0.0
        """While down, each call first takes this long on ``clock`` (a hung kvstore)."""
        self.clock = clock
        self.reconciled: list[list[int]] = []
        self.calls: list[str] = []
        self.lost = False
        """The scheduler's lease is lost (until its next reconcile, which registers again)."""
        self.lose_at_allocate = False
        """The next allocate finds the lease lost."""

    def _check(self) -> None:
        self.calls.append(sys._getframe(1).f_code.co_name)
        if self.down:
            if self.clock is not None:
                self.clock.now += self.hang_s
            raise KVStoreUnavailable("UNAVAILABLE: failed to connect to all addresses")

    def allocate(
        self, num_blocks: int, admitted_lookup: PrefixLookup | None = None
    ) -> list[int] | None:
        self._check()
        if self.lose_at_allocate:
            self.lost, self.lose_at_allocate = True, False
            raise KVLeaseLost("FAILED_PRECONDITION: owner-lease-expired")
        return self.local.allocate(num_blocks, admitted_lookup)

    def free(self, block_ids: list[int]) -> None:
        self._check()
        self.local.free(block_ids)

    def lookup(self, token_ids: Sequence[int], cache_salt: str, counted: bool) -> PrefixHit:
        self._check()
        return self.local.lookup(token_ids, cache_salt, counted)

    def commit(self, entries: Sequence[CommitEntry]) -> None:
        self._check()
        self.local.commit(entries)

    def reconcile(self, held_block_ids: list[int]) -> int:
        self._check()
        self.lost = False
        self.reconciled.append(sorted(held_block_ids))
        return self.local.reconcile(held_block_ids)

    def lease_lost(self) -> bool:
        return self.lost


def downable_scheduler() -> tuple[Scheduler, DownableAllocator, Clock]:
    """A scheduler over a :class:`DownableAllocator` of 16 blocks, on a clock of its own."""
    clock = Clock()
    allocator = DownableAllocator(16, clock)
    scheduler, _ = make_scheduler(
        16, BLOCK_SIZE, allocator=allocator, clock=clock, kv_unavailable_timeout_s=TIMEOUT_S
    )
    return scheduler, allocator, clock


def step(scheduler: Scheduler) -> tuple[list[str], dict[str, Unavailable]]:
    """One step with fake token 100 for each sampling request: (scheduled ids, failed)."""
    output = scheduler.schedule()
    scheduler.update(output, [100 for s in output.scheduled if s.samples])
    return [s.request.request_id for s in output.scheduled], output.failed


def test_requests_that_need_the_kvstore_end_after_the_timeout_the_others_finish() -> None:
    scheduler, allocator, clock = downable_scheduler()
    # "fits": 2 prompt tokens + 2 new fit in its first block; "grows": 4 + 4 needs a second.
    scheduler.add_request(make_engine_request("fits", range(10, 12), 3, ignore_eos=True))
    scheduler.add_request(make_engine_request("grows", range(10, 14), 4, ignore_eos=True))
    assert step(scheduler) == (["fits", "grows"], {})
    allocator.down = True
    scheduler.add_request(make_engine_request("waits", range(10, 13), 2, ignore_eos=True))

    # Before the timeout: "fits" decodes in its block; "grows" and "waits" wait.
    assert step(scheduler) == (["fits"], {})
    clock.now += TIMEOUT_S - 0.1
    assert step(scheduler) == (["fits"], {})
    # "fits" has its 3 tokens: finished, its block dropped here (the kvstore frees it on
    # reconcile); the other two still wait.
    assert set(scheduler.requests) == {"grows", "waits"}

    clock.now += 0.2
    scheduled, failed = step(scheduler)
    assert scheduled == []
    assert sorted(failed) == ["grows", "waits"]
    message = str(failed["grows"])
    assert message.startswith("kvstore: unusable for more than 30 s (UNAVAILABLE: failed")
    assert type(failed["grows"]) is Unavailable
    assert not scheduler.requests and not scheduler.running and not scheduler.waiting
    assert scheduler.kv.num_blocks_held == scheduler.kv.num_blocks_in_use == 0

    # The kvstore comes back: the scheduler declares it holds nothing, so every block is free.
    allocator.down = False
    scheduler.add_request(make_engine_request("after", range(10, 12), 1, ignore_eos=True))
    # Reconcile is tried at most once a second; before failing "after" for the old outage, the
    # scheduler probes once more and finds the kvstore back.
    assert step(scheduler) == ([], {})
    assert step(scheduler) == (["after"], {})
    assert allocator.reconciled == [[]]
    assert scheduler.kv.unusable_since is None
    pool = allocator.local
    assert pool.num_free_blocks == pool.num_blocks


def test_a_request_arriving_long_into_an_outage_ends_at_its_first_step() -> None:
    scheduler, allocator, clock = downable_scheduler()
    scheduler.add_request(make_engine_request("first", range(10, 12), 1, ignore_eos=True))
    allocator.down = True
    assert step(scheduler) == ([], {})
    assert scheduler.kv.unusable_since == clock.now
    # "first" waited out the timeout; a late arrival fails at once, not 30 s later.
    clock.now += TIMEOUT_S
    assert sorted(step(scheduler)[1]) == ["first"]
    clock.now += 100
    scheduler.add_request(make_engine_request("late", range(10, 12), 1, ignore_eos=True))
    assert sorted(step(scheduler)[1]) == ["late"]


def test_an_outage_shorter_than_the_timeout_loses_nothing_and_restarts_the_clock() -> None:
    scheduler, allocator, clock = downable_scheduler()
    scheduler.add_request(make_engine_request("a", range(10, 14), 8, ignore_eos=True))
    assert step(scheduler) == (["a"], {})  # block 0 full; a's next token needs block 1
    allocator.down = True
    assert step(scheduler) == ([], {})
    clock.now += TIMEOUT_S - 1
    allocator.down = False
    assert step(scheduler) == (["a"], {})
    assert scheduler.kv.unusable_since is None
    assert allocator.reconciled == [[0]]

    # A second outage is timed from the first call that fails in it: a decodes positions 5-7
    # in block 1, the commit of the full block 1 fails, and position 8 needs block 2.
    allocator.down = True
    clock.now += 10
    assert [step(scheduler)[0] for _ in range(3)] == [["a"], ["a"], ["a"]]
    assert scheduler.kv.unusable_since == clock.now
    assert step(scheduler) == ([], {})
    clock.now += TIMEOUT_S - 1
    assert step(scheduler) == ([], {})
    clock.now += 1
    assert sorted(step(scheduler)[1]) == ["a"]
    assert scheduler.requests == {}


def test_a_hung_kvstore_is_probed_once_a_second_and_timed_from_the_first_call() -> None:
    scheduler, allocator, clock = downable_scheduler()
    # "fits": its positions 2, 3 fit
    scheduler.add_request(make_engine_request("fits", range(10, 12), 8, ignore_eos=True))
    scheduler.add_request(make_engine_request("grows", range(10, 14), 8, ignore_eos=True))
    assert step(scheduler) == (["fits", "grows"], {})
    allocator.down, allocator.hang_s = True, 3.0
    allocator.calls.clear()

    # grows needs a second block: its Allocate hangs for the client's deadline (3 s), fails.
    assert step(scheduler) == (["fits"], {})
    assert allocator.calls == ["allocate"]
    assert scheduler.kv.unusable_since == 1000.0  # when the hung call began, not when it failed
    # Until reconciled, nothing but Reconcile reaches the kvstore, at most once a second: fits
    # decodes in its own block, then waits for a second one without asking.
    assert step(scheduler) == (["fits"], {})
    for _ in range(3):
        assert step(scheduler) == ([], {})
    assert allocator.calls == ["allocate"]
    clock.now += 1.0
    assert step(scheduler) == ([], {})
    assert allocator.calls == ["allocate", "reconcile"]
    # The timeout (30 s) counts from 1000.0: at 1030.0 both end, after one forced probe.
    clock.now = 1030.0
    allocator.hang_s = 0.0
    scheduled, failed = step(scheduler)
    assert (scheduled, sorted(failed)) == ([], ["fits", "grows"])
    assert allocator.calls == ["allocate", "reconcile", "reconcile"]


def test_a_lost_lease_recomputes_the_running_requests_without_writing_their_blocks() -> None:
    scheduler, allocator, clock = downable_scheduler()
    scheduler.add_request(make_engine_request("a", range(10, 16), 4, ignore_eos=True))
    scheduler.add_request(make_engine_request("b", range(10, 13), 4, ignore_eos=True))
    assert step(scheduler) == (["a", "b"], {})
    assert step(scheduler) == (["a", "b"], {})
    # The kvstore released this scheduler's references (its lease expired): the blocks a and b
    # hold are not theirs any more. Nothing is freed there; both are recomputed from scratch
    # after the scheduler registered again holding nothing.
    allocator.lost = True
    allocator.local.reconcile([])  # what the kvstore did when the lease expired
    output = scheduler.schedule()
    assert allocator.reconciled == [[]]
    assert [(s.request.request_id, s.num_computed_tokens) for s in output.scheduled] == [
        ("a", 0),
        ("b", 0),
    ]
    assert [s.num_new_tokens for s in output.scheduled] == [8, 5]  # prompt + 2 tokens sampled
    assert "free" not in allocator.calls
    assert scheduler.num_preemptions == 2
    scheduler.update(output, [100 for s in output.scheduled if s.samples])
    while scheduler.requests:
        step(scheduler)
    pool = allocator.local
    assert pool.num_free_blocks == pool.num_blocks


def test_a_lease_found_lost_while_planning_a_step_schedules_nothing_of_it() -> None:
    scheduler, allocator, clock = downable_scheduler()
    scheduler.add_request(make_engine_request("fits", range(10, 12), 3, ignore_eos=True))
    scheduler.add_request(make_engine_request("grows", range(10, 14), 4, ignore_eos=True))
    assert step(scheduler) == (["fits", "grows"], {})
    # "grows" needs a block: the kvstore refuses it, the lease is lost. "fits" was planned first
    # and fits its block, but that block is not its own any more: nothing runs this step.
    allocator.lose_at_allocate = True
    assert step(scheduler) == ([], {})
    assert [r.num_computed_tokens for r in scheduler.waiting] == [0, 0]
    assert step(scheduler) == (["fits", "grows"], {})
    assert allocator.reconciled[-1] == []
    while scheduler.requests:
        step(scheduler)
    pool = allocator.local
    assert pool.num_free_blocks == pool.num_blocks
