"""The launcher's own calls to the layers it runs: health checks, and a standby's activation."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.common.convert import activate_request_to_pb, activate_response_from_pb
from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.common.server import CHANNEL_OPTIONS
from zerolayer.v1 import scheduler_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def health_status(channel: grpc.Channel, service: str = "", timeout_s: float = 1.0) -> int | None:
    """The ``grpc.health.v1`` status of ``service`` ("" = the whole server) on ``channel``;
    None when it does not answer within ``timeout_s`` seconds (down, starting, hung, or the
    service unknown)."""
    request = health_pb2.HealthCheckRequest(service=service)
    try:
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout_s).status
    except grpc.RpcError:
        return None


def status_name(status: int | None) -> str | None:
    """The name of a ``grpc.health.v1`` status (``SERVING``, ``NOT_SERVING`` ...); None for
    None (no answer)."""
    return None if status is None else health_pb2.HealthCheckResponse.ServingStatus.Name(status)


def is_serving(address: str, service: str = "", timeout_s: float = 0.25) -> bool:
    """Whether the server at ``address`` reports SERVING on ``service`` now (one check on a new
    channel)."""
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        return health_status(channel, service, timeout_s) == SERVING


def activate_scheduler(address: str, timeout_s: float = 1.0) -> SchedulerRole:
    """Calls ``Scheduler/Activate`` on the scheduler at ``address``.

    Returns:
        Its role before the call (STANDBY: this call activated it).

    Raises:
        grpc.RpcError: it did not answer within ``timeout_s`` seconds.
    """
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return activate_response_from_pb(stub.Activate(activate_request_to_pb(), timeout=timeout_s))
