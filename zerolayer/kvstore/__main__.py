"""``python -m zerolayer.kvstore --address unix:PATH --loader unix:PATH --shm-path FILE``."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from zerolayer.common.clients import fetch_manifest
from zerolayer.common.config import KVStoreConfig
from zerolayer.common.metrics import serve_metrics
from zerolayer.common.server import (
    LayerServer,
    ServiceBinding,
    exit_with_launcher,
    run_layer,
    setup_logging,
)
from zerolayer.common.setting import add_arguments, config_from_args
from zerolayer.common.settings import layer_settings
from zerolayer.common.tracing import Tracing, TracingConfig
from zerolayer.kv.arena_file import ArenaSizeError
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.kvstore.metrics import KVStoreCollector
from zerolayer.kvstore.server import KVStoreServicer
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Flags of the kvstore (zerolayer.common.settings)."""
    parser = parser or argparse.ArgumentParser(prog="zerolayer kvstore", description=__doc__)
    return add_arguments(parser, layer_settings("kvstore"))


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
    config = config_from_args(KVStoreConfig, layer_settings("kvstore"), args)
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
