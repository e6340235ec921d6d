"""``python -m zerolayer.kvstore --address unix:PATH --loader unix:PATH --shm-path FILE``."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from zerolayer.common.clients import fetch_manifest
from zerolayer.common.config import DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_BYTES, KVStoreConfig
from zerolayer.common.device import add_device_argument
from zerolayer.common.metrics import add_metrics_port, serve_metrics
from zerolayer.common.server import (
    LayerServer,
    ServiceBinding,
    exit_with_launcher,
    run_layer,
    setup_logging,
)
from zerolayer.common.tracing import Tracing, TracingConfig
from zerolayer.kv.arena_file import ArenaSizeError
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.kvstore.metrics import KVStoreCollector
from zerolayer.kvstore.server import KVStoreServicer
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Flags of the kvstore."""
    parser = parser or argparse.ArgumentParser(prog="zerolayer kvstore", description=__doc__)
    parser.add_argument("--address", required=True, help="gRPC address to serve on")
    parser.add_argument("--loader", required=True, help="the loader's gRPC address")
    parser.add_argument(
        "--shm-path",
        required=True,
        help="shared-memory file of the arena (reopened if it exists with the same layout)",
    )
    parser.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=DEFAULT_KV_CACHE_BYTES,
        help="arena size in bytes (default %(default)s); its pages are reserved at start, so it "
        "must fit the free space of --shm-path's filesystem",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="tokens per KV block (default %(default)s)",
    )
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="never reuse blocks across requests (for comparison)",
    )
    parser.add_argument(
        "--remove-arena-on-exit",
        action="store_true",
        help="delete the arena file on a clean exit (default: keep it for a restart)",
    )
    add_device_argument(parser, "where the KV arena lives")
    parser.add_argument(
        "--fd-keeper",
        default="",
        help="unix socket of the launcher's descriptor keeper (zerolayer up sets it): on a GPU "
        "the KV arena's device memory survives restarts of this layer",
    )
    add_metrics_port(parser)
    return parser


async def serve(config: KVStoreConfig, tracing: Tracing) -> None:
    """Creates or reopens the arena for the loader's model, then serves until SIGTERM."""
    manifest = await asyncio.to_thread(fetch_manifest, config.loader_address)
    store = KVStore(config, manifest)
    serve_metrics(
        config.metrics_port, host=config.metrics_host, collectors=[KVStoreCollector(store)]
    )
    name = kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"].full_name
    server = LayerServer(
        config.address,
        [
            ServiceBinding(
                kvstore_pb2_grpc.add_KVStoreServicer_to_server, KVStoreServicer(store), name
            )
        ],
        tracing=tracing,
    )
    received = None
    try:
        received = await run_layer(server)
    finally:
        # NOTE: a kvstore whose launcher died (SIGHUP) removes the arena itself: nobody else will.
        store.close(remove_arena=config.remove_arena_on_exit or received == signal.SIGHUP)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Runs the kvstore with parsed flags; exit code 2, with a one-line message and no traceback,
    when ``--kv-cache-bytes`` holds no block or does not fit the arena's filesystem."""
    exit_with_launcher(dict(os.environ))
    setup_logging("kvstore")
    config = KVStoreConfig(
        address=args.address,
        loader_address=args.loader,
        shm_path=args.shm_path,
        kv_cache_bytes=args.kv_cache_bytes,
        block_size=args.block_size,
        enable_prefix_caching=not args.no_prefix_caching,
        remove_arena_on_exit=args.remove_arena_on_exit,
        device=args.device,
        fd_keeper=args.fd_keeper,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    try:
        asyncio.run(serve(config, Tracing(TracingConfig.from_env(os.environ, "kvstore"))))
    except ArenaSizeError as exc:
        print(
            f"zerolayer kvstore: error: --kv-cache-bytes {config.kv_cache_bytes}: {exc.reason}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
