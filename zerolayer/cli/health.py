"""``zerolayer health``: one ``grpc.health.v1.Health/Check`` call on a layer, as the exit code of a
probe (Kubernetes' exec liveness and startup probes: deploy/kubernetes/).

Source: the gRPC health checking protocol (grpc/grpc doc/health-checking.md). It imports no
torch: a probe runs every few seconds, for the life of the pod."""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``health`` to the ``zerolayer`` subcommands."""
    p = sub.add_parser(
        "health",
        help="check a layer's gRPC health (exit 0 when SERVING: a probe command)",
        description="Calls grpc.health.v1.Health/Check on ADDRESS. Exit code 0 when the status "
        "is SERVING (with --alive: any answer), 1 otherwise, with the reason on one line of "
        "stderr.",
    )
    p.add_argument(
        "--address",
        required=True,
        help="the layer's gRPC address: unix:PATH (loader, kvstore, scheduler) or HOST:PORT",
    )
    p.add_argument(
        "--service",
        default="",
        help="the health service name to check (default: the server's overall health)",
    )
    p.add_argument(
        "--alive",
        action="store_true",
        help="exit 0 on any answer, NOT_SERVING included: the process lives (the liveness of a "
        "frontend, whose health follows its schedulers')",
    )
    p.add_argument(
        "--timeout", type=float, default=5.0, help="deadline of the call in seconds (default 5)"
    )


def check(address: str, service: str = "", timeout_s: float = 5.0) -> int:
    """The health status ``address`` reports for ``service`` (a ``HealthCheckResponse``
    ``ServingStatus`` value).

    Raises:
        grpc.RpcError: no answer within ``timeout_s`` seconds (UNAVAILABLE, DEADLINE_EXCEEDED),
            or NOT_FOUND for a service name the server does not know.
    """
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        return stub.Check(request, timeout=timeout_s).status


def run_health(args: argparse.Namespace) -> int:
    """``zerolayer health``: 0 when ``--address`` reports SERVING (``--alive``: answers at all);
    1 with one line on stderr naming the address and the status or the call's error."""
    try:
        status = check(args.address, args.service, args.timeout)
    except grpc.RpcError as exc:
        details = exc.details() or {"NOT_FOUND": "no such service"}.get(exc.code().name, "")
        print(f"zerolayer health: {args.address}: {exc.code().name}: {details}", file=sys.stderr)
        return 1
    if status == SERVING or args.alive:
        return 0
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    print(f"zerolayer health: {args.address}: {name}", file=sys.stderr)
    return 1
