"""``python -m services.kvstore --address unix:PATH --loader unix:PATH --shm-path FILE``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from services.common.clients import fetch_manifest
from services.common.config import DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_BYTES, KVStoreConfig
from services.common.server import LayerServer, ServiceBinding, run_layer, setup_logging
from services.kvstore.kv_store import KVStore
from services.kvstore.server import KVStoreServicer
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Flags of the kvstore."""
    parser = parser or argparse.ArgumentParser(prog="zerolayer kvstore", description=__doc__)
    parser.add_argument("--address", required=True, help="gRPC address to serve on")
    parser.add_argument("--loader", required=True, help="the loader's gRPC address")
    parser.add_argument("--shm-path", required=True, help="shared-memory file of the arena")
    parser.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=DEFAULT_KV_CACHE_BYTES,
        help="arena size in bytes (default %(default)s)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="tokens per KV block (default %(default)s)",
    )
    return parser


async def serve(config: KVStoreConfig) -> None:
    """Creates the arena for the loader's model, then serves until SIGTERM."""
    manifest = await asyncio.to_thread(fetch_manifest, config.loader_address)
    store = KVStore(config, manifest)
    name = kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"].full_name
    server = LayerServer(
        config.address,
        [
            ServiceBinding(
                kvstore_pb2_grpc.add_KVStoreServicer_to_server, KVStoreServicer(store), name
            )
        ],
    )

    async def on_stop() -> None:
        store.close()

    try:
        await run_layer(server, on_stop=on_stop)
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Runs the kvstore with parsed flags."""
    setup_logging("kvstore")
    config = KVStoreConfig(
        address=args.address,
        loader_address=args.loader,
        shm_path=args.shm_path,
        kv_cache_bytes=args.kv_cache_bytes,
        block_size=args.block_size,
    )
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
