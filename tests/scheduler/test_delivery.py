"""LoopDelivery: outputs queued on another thread reach their asyncio queues in order, with one
wake-up of the loop per flush."""

from __future__ import annotations

import asyncio
import threading

from zerolayer.common.errors import Unavailable
from zerolayer.scheduler.delivery import LoopDelivery


def test_a_flush_hands_every_queued_output_over_with_one_wake_up() -> None:
    async def main() -> tuple[list[list[object]], int]:
        loop = asyncio.get_running_loop()
        wake_ups = 0
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counting(*args: object) -> object:
            nonlocal wake_ups
            wake_ups += 1
            return call_soon_threadsafe(*args)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        delivery = LoopDelivery(loop)
        queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(16)]
        sinks = [delivery.sink(q) for q in queues]
        error = Unavailable("gone")

        def engine_step() -> None:  # what the engine thread does in one step
            for i, sink in enumerate(sinks):
                sink(i)  # type: ignore[arg-type]
                sink(error if i == 15 else 100 + i)  # type: ignore[arg-type]
            sinks[0].flush()
            sinks[7].flush()  # the same flush: already pending, no second wake-up

        thread = threading.Thread(target=engine_step)
        thread.start()
        thread.join()
        got = [[await q.get(), await q.get()] for q in queues]
        delivery.flush()  # nothing queued: nothing happens
        await asyncio.sleep(0)
        return got, wake_ups

    got, wake_ups = asyncio.run(main())
    assert wake_ups == 1
    assert got[:15] == [[i, 100 + i] for i in range(15)]
    assert got[15][0] == 15 and isinstance(got[15][1], Unavailable)
