"""``python -m zerolayer.loader --address unix:PATH --model DIR``: run the loader alone
(``--model`` may also be a GGUF file)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.common import settings
from zerolayer.common.config import LoaderConfig
from zerolayer.common.device import fd_socket_path, resolve_device
from zerolayer.common.layer_main import LayerProgram, main
from zerolayer.common.metrics import ServingCollector, serve_metrics
from zerolayer.common.server import LayerServer, ServiceBinding, run_layer
from zerolayer.common.tracing import Tracing
from zerolayer.loader.metrics import LoaderCollector
from zerolayer.loader.server import LoaderServicer
from zerolayer.loader.weight_store import WeightStore
from zerolayer.sharing.handle_kinds import offered_kinds
from zerolayer.v1 import loader_pb2, loader_pb2_grpc


async def serve(config: LoaderConfig, tracing: Tracing) -> None:
    """Maps the checkpoint, then serves until SIGTERM."""
    store = WeightStore(Path(config.model_dir), config.model_name, config.dtype)
    if config.prefetch:
        store.prefetch()
    device = resolve_device(config.device)
    device_weights = None
    if device.is_cuda:
        from zerolayer.loader.device_weights import DeviceWeights  # torch: GPU only

        # The device copy starts once the server is up; importers wait for its layers through
        # GetResidency.
        device_weights = DeviceWeights(
            store.manifest,
            store.files,
            store.model_config.num_hidden_layers,
            device.index,
            offered_kinds(str(device))[0],
            fd_socket_path(config.address, "loader", os.getpid()),
            keeper=config.fd_keeper,
        )
    name = loader_pb2.DESCRIPTOR.services_by_name["Loader"].full_name
    servicer = LoaderServicer(store, device_weights)
    server = LayerServer(
        config.address,
        [ServiceBinding(loader_pb2_grpc.add_LoaderServicer_to_server, servicer, name)],
        tracing=tracing,
    )
    serving = ServingCollector(
        "zerolayer_loader_",
        "1 while the loader's gRPC health is SERVING (its weights are open), else 0",
        lambda: server.is_serving(name),
    )
    serve_metrics(
        config.metrics_port,
        host=config.metrics_host,
        collectors=[LoaderCollector(store), serving],
    )

    async def on_start() -> None:
        if device_weights is not None:
            device_weights.start_copy()

    async def on_stop() -> None:
        if device_weights is not None:
            device_weights.close()
        store.close()

    await run_layer(server, on_start=on_start, on_stop=on_stop)


PROGRAM = LayerProgram(
    "loader",
    LoaderConfig,
    serve,
    __doc__,
    # a model that cannot be read, alone (up refuses it before it starts the loader)
    setting_errors=((CheckpointError, settings.MODEL_DIR),),
)

if __name__ == "__main__":
    sys.exit(main(PROGRAM))
