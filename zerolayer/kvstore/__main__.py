"""``python -m zerolayer.kvstore --address unix:PATH --loader unix:PATH --shm-path FILE``."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from zerolayer.common.clients import fetch_manifest
from zerolayer.common.config import KVStoreConfig
from zerolayer.common.layer_main import LayerProgram, main
from zerolayer.common.metrics import ServingCollector, serve_metrics
from zerolayer.common.server import FINAL_STOP, LayerServer, ServiceBinding, run_layer
from zerolayer.common.settings import KV_CACHE_BYTES, SHM_PATH
from zerolayer.common.tracing import Tracing
from zerolayer.kv.arena_file import ArenaSizeError
from zerolayer.kv.private_file import UntrustedFileError
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.kvstore.metrics import KVStoreCollector
from zerolayer.kvstore.server import KVStoreServicer
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc

log = logging.getLogger(__name__)


async def serve(config: KVStoreConfig, tracing: Tracing) -> None:
    """Creates or reopens the arena for the loader's model, then serves until SIGTERM."""
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
        tracing=tracing,
    )
    serving = ServingCollector(
        "zerolayer_kv_",
        "1 while the kvstore's gRPC health is SERVING (its arena is open), else 0",
        lambda: server.is_serving(name),
    )
    serve_metrics(
        config.metrics_port,
        host=config.metrics_host,
        collectors=[KVStoreCollector(store), serving],
    )
    received = None
    sweeper = asyncio.create_task(sweep_leases(store))
    try:
        received = await run_layer(server)
    finally:
        sweeper.cancel()
        # NOTE: SIGHUP: the launcher died (nobody else will remove the arena); FINAL_STOP: the
        # launcher stops the stack for good. Nothing will reopen the arena.
        final = received in (signal.SIGHUP, FINAL_STOP)
        store.close(remove_arena=config.remove_arena_on_exit or final)


async def sweep_leases(store: KVStore) -> None:
    """Expires the owners' lapsed leases every ``store.owners.sweep_interval_s`` until cancelled
    (on the event loop that serves the calls, so no lock is needed)."""
    while True:
        await asyncio.sleep(store.owners.sweep_interval_s)
        try:
            store.sweep()
        except Exception:  # noqa: BLE001 - e.g. the sidecar could not be written: sweep on
            log.exception("lease sweep failed")


PROGRAM = LayerProgram(
    "kvstore",
    KVStoreConfig,
    serve,
    __doc__,
    # NOTE: --kv-cache-bytes holds no block or does not fit the arena's filesystem; the file at
    # --shm-path (or its sidecar) is not this user's private file.
    setting_errors=((ArenaSizeError, KV_CACHE_BYTES), (UntrustedFileError, SHM_PATH)),
)

if __name__ == "__main__":
    sys.exit(main(PROGRAM))
