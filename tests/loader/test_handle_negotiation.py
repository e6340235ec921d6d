"""Handle-kind negotiation through the real loader and kvstore servicers: what a CPU importer, a
GPU importer and a confused one get, with a CPU stand-in for the loader's device copy."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model
from zerolayer.common.config import KVStoreConfig
from zerolayer.common.convert import manifest_from_pb
from zerolayer.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.kvstore.server import KVStoreServicer
from zerolayer.loader.device_copy import plan_placement
from zerolayer.loader.server import LoaderServicer
from zerolayer.loader.weight_store import WeightStore
from zerolayer.scheduler.model.device_import import wait_for_layers
from zerolayer.sharing.file_identity import WeightFileChanged
from zerolayer.sharing.manifest import DeviceMemoryHandle, HandleKind, WeightManifest
from zerolayer.v1 import kvstore_pb2, loader_pb2

NUM_LAYERS = PRESETS["tiny"].num_hidden_layers


class StandInDeviceWeights:
    """What LoaderServicer needs of DeviceWeights, without a GPU: a handle, per-layer progress,
    the manifest rewrite (the real one, from device_weights.DeviceWeights.manifest_for)."""

    def __init__(self, manifest: WeightManifest) -> None:
        self.placement = plan_placement(manifest.tensors, NUM_LAYERS)
        self.handle = DeviceMemoryHandle(
            kind=HandleKind.CUDA_VMM_FD,
            device="cuda:0",
            gpu_uuid="GPU-00000000-0000-0000-0000-000000000000",
            size_bytes=self.placement.size_bytes,
            fd_socket="/run/zl/loader.sock.fds",
            handle_id="weights-1",
        )
        self.num_layers_resident = 1
        self.error: BaseException | None = None

    def manifest_for(self, manifest: WeightManifest) -> WeightManifest:
        from zerolayer.loader.device_weights import DeviceWeights

        return DeviceWeights.manifest_for(self, manifest)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> WeightStore:
    model_dir = write_dummy_model(tmp_path_factory.mktemp("m"), PRESETS["tiny"], seed=1)
    return WeightStore(Path(model_dir))


def manifest(servicer: LoaderServicer, *kinds: HandleKind) -> WeightManifest:
    request = loader_pb2.GetManifestRequest(accepted_handle_kinds=[int(k) for k in kinds])
    return manifest_from_pb(asyncio.run(servicer.GetManifest(request, None)))


def residency(servicer: LoaderServicer) -> loader_pb2.Residency:
    return asyncio.run(servicer.GetResidency(loader_pb2.GetResidencyRequest(), None))


def test_cpu_loader_serves_file_mappings_to_cpu_and_gpu_importers(store: WeightStore) -> None:
    servicer = LoaderServicer(store)
    for kinds in [(), (HandleKind.MMAP_FILE,), (HandleKind.CUDA_VMM_FD, HandleKind.MMAP_FILE)]:
        got = manifest(servicer, *kinds)
        assert got.handle_kind == HandleKind.MMAP_FILE and got.device_memory is None
    with pytest.raises(FailedPrecondition, match="accepted_handle_kinds"):
        manifest(servicer, HandleKind.CUDA_VMM_FD, HandleKind.CUDA_IPC)
    with pytest.raises(InvalidArgument, match="accepted_handle_kinds"):
        manifest(servicer, 99)  # type: ignore[arg-type]
    r = residency(servicer)
    assert (r.num_layers, r.num_layers_resident, r.device) == (NUM_LAYERS, NUM_LAYERS, "cpu")


def test_gpu_loader_gives_gpu_importers_the_device_copy_and_cpu_ones_the_files(
    store: WeightStore,
) -> None:
    device = StandInDeviceWeights(store.manifest)
    servicer = LoaderServicer(store, device)  # type: ignore[arg-type]
    gpu = manifest(servicer, HandleKind.CUDA_VMM_FD, HandleKind.CUDA_IPC, HandleKind.MMAP_FILE)
    assert gpu.handle_kind == HandleKind.CUDA_VMM_FD
    assert gpu.device_memory == device.handle
    assert {t.name: t.device_offset_bytes for t in gpu.tensors} == device.placement.offsets
    # Everything else in the manifest is the file form's.
    cpu = manifest(servicer)
    assert cpu.device_memory is None and cpu.handle_kind == HandleKind.MMAP_FILE
    strip = dict(handle_kind=HandleKind.MMAP_FILE, device_memory=None, tensors=cpu.tensors)
    assert dataclasses.replace(gpu, **strip) == cpu
    # An importer that only maps IPC gets nothing from a VMM exporter.
    with pytest.raises(FailedPrecondition, match="CUDA_VMM_FD"):
        manifest(servicer, HandleKind.CUDA_IPC)
    r = residency(servicer)
    assert (r.num_layers, r.num_layers_resident, r.device) == (NUM_LAYERS, 1, "cuda:0")
    device.error = RuntimeError("cudaMemcpyAsync failed")
    with pytest.raises(Unavailable, match="cudaMemcpyAsync"):
        residency(servicer)


def test_cpu_kvstore_arena_is_refused_to_a_gpu_only_importer(
    store: WeightStore, tmp_path: Path
) -> None:
    config = KVStoreConfig(
        address="unix:/unused",
        loader_address="unix:/unused",
        shm_path=str(tmp_path / "arena.kv"),
        kv_cache_bytes=1 << 20,
    )
    servicer = KVStoreServicer(KVStore(config, store.manifest))

    def arena(*kinds: HandleKind) -> kvstore_pb2.ArenaInfo:
        request = kvstore_pb2.GetArenaRequest(accepted_handle_kinds=[int(k) for k in kinds])
        return asyncio.run(servicer.GetArena(request, None))

    info = arena()
    assert info.device == "cpu" and info.handle_kind == HandleKind.MMAP_FILE
    assert info.shm_path == config.shm_path and not info.HasField("device_memory")
    with pytest.raises(FailedPrecondition, match="accepted_handle_kinds"):
        arena(HandleKind.CUDA_VMM_FD, HandleKind.CUDA_IPC)


def test_wait_for_layers_polls_until_all_are_resident_or_times_out() -> None:
    progress = iter([(0, 4), (2, 4), (4, 4)])
    sleeps: list[float] = []
    assert wait_for_layers(lambda: next(progress), sleep=sleeps.append) == 4
    assert len(sleeps) == 2
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(Unavailable, match="1 of 4 layers"):
        wait_for_layers(lambda: (1, 4), timeout_s=1.0, poll_s=0.3, clock=clock, sleep=sleep)


def test_a_truncated_file_is_refused_to_file_importers_only(tmp_path: Path) -> None:
    """The device copy no longer needs the files: GPU importers still get it."""
    model_dir = write_dummy_model(tmp_path / "m", PRESETS["tiny"], seed=1)
    store = WeightStore(Path(model_dir))
    cpu_servicer = LoaderServicer(store)
    gpu_servicer = LoaderServicer(store, StandInDeviceWeights(store.manifest))  # type: ignore[arg-type]
    os.truncate(store.manifest.files[0], 100)
    changed = f"weight file {store.manifest.files[0]} changed since the loader opened it"
    for servicer in (cpu_servicer, gpu_servicer):
        with pytest.raises(WeightFileChanged, match=changed):
            manifest(servicer, HandleKind.MMAP_FILE)
    with pytest.raises(WeightFileChanged, match=changed):
        residency(cpu_servicer)
    gpu = manifest(gpu_servicer, HandleKind.CUDA_VMM_FD, HandleKind.MMAP_FILE)
    assert gpu.handle_kind == HandleKind.CUDA_VMM_FD
    assert residency(gpu_servicer).num_layers_resident == 1
