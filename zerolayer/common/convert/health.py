"""Conversion of ``grpc.health.v1`` messages, for the frontend's watch of its schedulers."""

from __future__ import annotations

from grpc_health.v1 import health_pb2


def health_request_to_pb(service: str) -> health_pb2.HealthCheckRequest:
    """A Check or Watch request for the health name ``service`` ("" = the whole server)."""
    return health_pb2.HealthCheckRequest(service=service)


def serving_from_health_pb(pb: health_pb2.HealthCheckResponse) -> bool:
    """True for SERVING; False for NOT_SERVING, SERVICE_UNKNOWN and UNKNOWN."""
    return pb.status == health_pb2.HealthCheckResponse.SERVING


def serving_status_to_pb(serving: bool) -> health_pb2.HealthCheckResponse.ServingStatus:
    """The status a health servicer reports: SERVING or NOT_SERVING."""
    response = health_pb2.HealthCheckResponse
    return response.SERVING if serving else response.NOT_SERVING
