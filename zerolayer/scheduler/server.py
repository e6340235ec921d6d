"""Thin gRPC handlers of the scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
from opentelemetry import context as otel_context
from opentelemetry.trace import get_current_span

from zerolayer.common.convert import (
    abort_sample_request_from_pb,
    abort_sample_response_to_pb,
    activate_response_to_pb,
    engine_request_from_pb,
    request_output_to_pb,
    scheduler_stats_to_pb,
)
from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import RequestOutput
from zerolayer.common.tracing import Tracing
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.delivery import LoopDelivery
from zerolayer.scheduler.request_trace import RequestTrace
from zerolayer.scheduler.role import RoleSwitch
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    """zerolayer.v1.Scheduler over an :class:`Engine`."""

    def __init__(
        self,
        role: RoleSwitch,
        tracing: Tracing | None = None,
        outage: Callable[[], str] = str,
    ) -> None:
        """
        Args:
            role: active or standby.
            tracing: None: no request spans.
            outage: why the scheduler's service reports NOT_SERVING though the engine is fine
                (its kvstore is down, see :mod:`zerolayer.scheduler.kv_health`); "" when it is
                not. GetStats reports it as the not-serving reason.
        """
        self._engine: Engine | None = None
        self._role = role
        self._tracing = tracing
        self._outage = outage
        self._delivery: LoopDelivery | None = None

    def attach(self, engine: Engine) -> None:
        """Starts serving requests with ``engine`` (until then calls get UNAVAILABLE)."""
        self._engine = engine

    def _require_engine(self) -> Engine:
        if self._engine is None:
            raise Unavailable("scheduler: the engine is still starting")
        return self._engine

    async def Generate(
        self, request: scheduler_pb2.EngineRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[scheduler_pb2.EngineOutput]:
        engine = self._require_engine()
        engine_request = engine_request_from_pb(request)
        if self._delivery is None:
            self._delivery = LoopDelivery(asyncio.get_running_loop())
        outputs: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        # NOTE: only a call of a caller's trace is traced (the frontend's; see
        # TracingServerInterceptor): spans without a current one would each be a root.
        parent = otel_context.get_current()
        trace = (
            RequestTrace(self._tracing, parent)
            if self._tracing is not None
            and self._tracing.enabled
            and get_current_span(parent).get_span_context().is_valid
            else None
        )
        # NOTE: the engine flushes the delivery once per step: one wake-up of this loop for all
        # the step's outputs, not one per output.
        engine.submit(engine_request, self._delivery.sink(outputs), trace)
        finished = False
        num_unfinished = max(engine_request.n, 1)
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                # NOTE: with n > 1 the call ends when every sample has finished.
                num_unfinished -= item.finished
                finished = num_unfinished == 0
                yield request_output_to_pb(item)
        finally:
            if not finished:
                # Cancelled by the caller (or its deadline): free the blocks now.
                engine.abort(engine_request.request_id)

    async def AbortSample(
        self, request: scheduler_pb2.AbortSampleRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.AbortSampleResponse:
        self._require_engine().abort_sample(*abort_sample_request_from_pb(request))
        return abort_sample_response_to_pb()

    async def GetStats(
        self, request: scheduler_pb2.SchedulerStatsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.SchedulerStats:
        engine = self._require_engine()
        return scheduler_stats_to_pb(
            engine.stats(),
            engine.runner.block_size,
            engine.not_serving_reason or self._outage(),
            self._role.role,
        )

    async def Activate(
        self, request: scheduler_pb2.ActivateRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ActivateResponse:
        # NOTE: no engine needed: a scheduler activated while it starts serves once warmed.
        return activate_response_to_pb(await self._role.activate())
