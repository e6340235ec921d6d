"""The frontend's schedulers as one engine: each request is routed to one of them
(:mod:`zerolayer.frontend.routing.router`), and a stream whose scheduler dies continues on
another, or on the restarted one (:mod:`zerolayer.frontend.routing.failover`). The caller sees one
stream of outputs: no error, no token twice or missing, the original request's id and counts."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass

from zerolayer.common.errors import InvalidArgument, SchedulerLost, Unavailable
from zerolayer.common.generation import EngineRequest, RequestOutput
from zerolayer.frontend.routing.failover import InFlight, draw_seed, with_seed
from zerolayer.frontend.routing.public_errors import redacted
from zerolayer.frontend.routing.router import Router
from zerolayer.frontend.routing.scheduler_client import SchedulerClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Waits:
    """How long requests wait for a scheduler that can take them."""

    new_request_s: float
    """A request not sent yet (``--scheduler-wait-s``), seconds."""
    failover_s: float
    """A request whose scheduler died carrying it, from that moment (``--failover-wait-s``)."""


class SchedulerPool:
    """Routes requests to the schedulers and resubmits those of a scheduler that dies."""

    def __init__(
        self,
        clients: Mapping[str, SchedulerClient],
        router: Router,
        waits: Waits,
        draw: Callable[[], int] = draw_seed,
    ) -> None:
        """
        Args:
            clients: one per scheduler address of ``router``.
            router: chooses a scheduler per (re)submission; told of schedulers found gone.
            waits: how long requests wait for a scheduler.
            draw: draws the seed of a sampled request without one (see ``with_seed``).
        """
        self.clients = dict(clients)
        self.router = router
        self._waits = waits
        self._draw = draw
        self._flights: dict[tuple[str, str], InFlight] = {}
        """The requests in flight by (tenant, request_id): ids are unique per tenant."""

    async def generate(
        self,
        request: EngineRequest,
        timeout_s: float | None,
        max_model_len: int,
        tenant: str = "",
    ) -> AsyncIterator[RequestOutput]:
        """Yields the request's outputs until the finished one (of every sample, with n > 1),
        whichever schedulers carry it.

        Args:
            request: the validated request.
            timeout_s: the call's remaining time (None: no deadline), seconds.
            max_model_len: the model's context length, tokens.
            tenant: the caller's tenant (zerolayer.frontend.tenants; "": none). Request ids
                are unique per tenant: another tenant's id in flight neither refuses this
                request nor is told of. With a tenant, every submission's id in the scheduler
                is a fresh :func:`~zerolayer.frontend.routing.failover.resubmission_id`, so tenants'
                ids never meet there; the outputs carry the request's own id.

        Raises:
            InvalidArgument: ``request_id`` is in flight in this frontend for ``tenant``.
            Unavailable: no scheduler could take it in time, one answered UNAVAILABLE itself,
                or schedulers died under the request in two separate incidents (see
                :mod:`zerolayer.frontend.routing.failover`).
            grpc.aio.AioRpcError: a scheduler rejected it, or the deadline passed.
        """
        key = (tenant, request.request_id)
        if key in self._flights:
            raise InvalidArgument("request_id", f"{request.request_id!r} is in flight")
        flight = InFlight(with_seed(request, self._draw), max_model_len, bool(tenant))
        self._flights[key] = flight
        try:
            # NOTE: aclosing, here and below: a caller that stops early must end the call (and
            # the work counted) at once, not when the garbage collector finalizes the generators.
            async with aclosing(self._carry(flight, timeout_s)) as outputs:
                async for output in outputs:
                    yield output
        finally:
            del self._flights[key]

    async def abort_sample(self, request_id: str, index: int, tenant: str = "") -> None:
        """Ends sample ``index`` of a request in flight with n > 1 in its scheduler (e.g. a stop
        string ended it here); the request's stream then gets that sample's ABORT output. Best
        effort: unknown ids and failed calls change nothing."""
        flight = self._flights.get((tenant, request_id))
        where = None if flight is None else flight.sample_submission(index)
        if where is not None:
            address, submission_id, scheduler_index = where
            await self.clients[address].abort_sample(submission_id, scheduler_index)

    async def _carry(
        self, flight: InFlight, timeout_s: float | None, wait_s: float | None = None
    ) -> AsyncIterator[RequestOutput]:
        """``flight``'s outputs across schedulers; waits ``wait_s`` (None: a new request's
        wait) for the first."""
        start = time.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        wait_until = start + (self._waits.new_request_s if wait_s is None else wait_s)
        while True:
            wait_s = wait_until - time.monotonic()
            if deadline is not None:
                wait_s = min(wait_s, deadline - time.monotonic())
            address = await self._acquire(wait_s, flight)
            try:
                left_s = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                async with aclosing(self._submit(address, flight, left_s)) as outputs:
                    async for output in outputs:
                        yield output
                return
            except SchedulerLost as lost:
                self._forget(address)
                self._count_loss(flight, lost)
                if lost.carrying:
                    wait_until = time.monotonic() + self._waits.failover_s
            if flight.must_split:
                left_s = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                samples = self._carry_samples(flight, left_s, wait_until - time.monotonic())
                async with aclosing(samples) as outputs:
                    async for output in outputs:
                        yield output
                return
            if (last := flight.finish_if_spent()) is not None:
                yield last
                return

    async def _carry_samples(
        self, flight: InFlight, timeout_s: float | None, wait_s: float
    ) -> AsyncIterator[RequestOutput]:
        """Carries the unfinished samples of ``flight`` (n > 1, its scheduler lost after some
        output) each as a request of its own (:meth:`InFlight.split`), concurrently; yields
        their outputs, with their sample's index, as they come.

        Raises:
            Unavailable, grpc.aio.AioRpcError: what a sample's carrying raised (the others are
                cancelled).
        """
        outputs: asyncio.Queue[RequestOutput | BaseException | None] = asyncio.Queue()

        async def carry(index: int, sample: InFlight) -> None:
            try:
                if (last := sample.finish_if_spent()) is not None:
                    await outputs.put(dataclasses.replace(last, index=index))
                    return
                async with aclosing(self._carry(sample, timeout_s, wait_s)) as carried:
                    async for output in carried:
                        await outputs.put(dataclasses.replace(output, index=index))
            except Exception as exc:  # noqa: BLE001 - re-raised by the consumer below
                await outputs.put(exc)
            finally:
                outputs.put_nowait(None)

        tasks = [asyncio.create_task(carry(i, sample)) for i, sample in flight.split()]
        try:
            num_running = len(tasks)
            while num_running:
                item = await outputs.get()
                if item is None:
                    num_running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _acquire(self, wait_s: float, flight: InFlight) -> str:
        """The scheduler for ``flight``'s next submission (see :meth:`Router.acquire`).

        Raises:
            Unavailable: none can take it within ``wait_s`` seconds; the message describes each
                scheduler by what it says of itself (``standby`` only when its role is that,
                ``not serving`` otherwise) and carries the reasons those that stopped serving
                gave (e.g. a fatal GPU event, its kvstore down); logged with their addresses.
        """
        try:
            return await self.router.acquire(
                wait_s, flight.request.prompt_token_ids, flight.request.cache_salt
            )
        except Unavailable:
            reports = {a: await client.self_report() for a, client in self.clients.items()}
            up = {a: report.describe() for a, report in reports.items() if report is not None}
            log.warning(
                "no scheduler can take a request: %s",
                self.router.describe(by_address=True, up=up),
            )
            reasons = [r.not_serving_reason for r in reports.values() if r is not None]
            said = "; ".join(dict.fromkeys(redacted(reason) for reason in reasons if reason))
            none = f"scheduler: none can take requests ({self.router.describe(up=up)})"
            raise Unavailable(f"{none}: {said}" if said else none) from None

    async def _submit(
        self, address: str, flight: InFlight, timeout_s: float | None
    ) -> AsyncIterator[RequestOutput]:
        """One (re)submission of ``flight`` to ``address``, its work counted there."""
        request = flight.submission()
        flight.submitted_to = (address, request.request_id)
        with self.router.working(address, flight.num_outstanding_tokens) as work:
            client = self.clients[address]
            async with aclosing(client.generate(request, timeout_s)) as outputs:
                async for output in outputs:
                    output = flight.received(output)
                    work.set(flight.num_outstanding_tokens)
                    yield output
                    if flight.finished:
                        return

    @staticmethod
    def _count_loss(flight: InFlight, lost: SchedulerLost) -> None:
        """Counts the loss against ``flight`` and logs what follows, one WARNING line.

        Raises:
            Unavailable: the request is given up (see :meth:`InFlight.lost`).
        """
        request_id = flight.request.request_id
        try:
            flight.lost(lost.carrying, time.monotonic())
        except Unavailable as verdict:
            log.warning("request %s: %s; given up as poison: %s", request_id, lost, verdict)
            raise
        if lost.carrying:
            num_tokens = len(flight.generated_token_ids)
            log.warning(
                "request %s: %s after %d tokens; resubmitting", request_id, lost, num_tokens
            )

    def _forget(self, address: str) -> None:
        """A call found ``address`` gone: route nothing there until its health says SERVING
        again (asked afresh, in case only the call's connection broke)."""
        self.router.set_health(address, active=False, warm=False)
        self.clients[address].watch_again()

    async def block_size(self) -> int:
        """The KV block size of the schedulers (one for all, from the model's KV layout), as
        the first that answers GetStats says: one that can take requests first, else any that
        runs (e.g. one whose kvstore is down); 0 when none answers."""
        first = self.router.pick()
        for address in sorted(self.clients, key=lambda a: a != first):
            # NOTE: one that takes no requests may be hung: a second each at most
            timeout_s = 5.0 if address == first else 1.0
            if block_size := await self.clients[address].block_size(timeout_s):
                return block_size
        return 0

    async def close(self) -> None:
        """Closes every client."""
        for client in self.clients.values():
            await client.close()
