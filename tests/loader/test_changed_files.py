"""Weight files that change under a running loader (a real loader process, a sharded model).

A file renamed into place leaves the loader's mapping of the old inode intact: the loader keeps
serving, and an importer that opens the path now (a restarted scheduler) refuses the new file. A
file truncated in place would raise SIGBUS on any read of its lost pages: the loader never reads
them, stays up and answers FAILED_PRECONDITION naming the file; a scheduler started then exits
with that one line (code 2) instead of mapping it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from safetensors.torch import load_file, save_file

from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model
from zerolayer.common.convert import manifest_from_pb
from zerolayer.scheduler.model.weights import MappedWeights
from zerolayer.sharing.file_identity import WeightFileChanged
from zerolayer.sharing.manifest import WeightManifest
from zerolayer.v1 import loader_pb2, loader_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def write_sharded_model(model_dir: Path) -> Path:
    """The tiny dummy model with its tensors split over two files and an index."""
    write_dummy_model(model_dir, PRESETS["tiny"], seed=1)
    tensors = load_file(model_dir / "model.safetensors")
    (model_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, file_name in enumerate(SHARDS):
        part = names[i :: len(SHARDS)]
        save_file({n: tensors[n] for n in part}, str(model_dir / file_name))
        weight_map.update(dict.fromkeys(part, file_name))
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return model_dir


@pytest.fixture(scope="module")
def loader(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    base = tmp_path_factory.mktemp("changed")
    address = f"unix:{base / 'loader.sock'}"
    model_dir = write_sharded_model(base / "model")
    process = subprocess.Popen(
        [sys.executable, "-m", "zerolayer.loader", "--address", address, "--model", str(model_dir)],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield address, model_dir, process
    process.terminate()
    process.wait(timeout=30)


def get_manifest(address: str) -> WeightManifest:
    with grpc.insecure_channel(address) as channel:
        pb = loader_pb2_grpc.LoaderStub(channel).GetManifest(
            loader_pb2.GetManifestRequest(), timeout=60, wait_for_ready=True
        )
    return manifest_from_pb(pb)


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status


def run_scheduler(address: str, base: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "zerolayer.scheduler", "--address"]
    command += [f"unix:{base / 'scheduler.sock'}", "--loader", address]
    command += ["--kvstore", f"unix:{base / 'no-kvstore.sock'}"]
    return subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_changed_weight_files(loader: tuple[str, Path, subprocess.Popen]) -> None:
    address, model_dir, process = loader
    before = get_manifest(address)
    assert [Path(f).name for f in before.files] == list(SHARDS)
    assert [i.inode for i in before.file_identities] == [
        (model_dir / name).stat().st_ino for name in SHARDS
    ]

    # Replaced by a rename (as `mv` or a hub download): the loader keeps serving its mapping.
    first = model_dir / SHARDS[0]
    shutil.copy(first, model_dir / "new.safetensors")
    os.replace(model_dir / "new.safetensors", first)
    assert get_manifest(address) == before
    with pytest.raises(WeightFileChanged, match=f"weight file {first} changed since the loader"):
        MappedWeights(before)  # what a scheduler started now would do

    # Truncated in place (as `cp` over it): reported, never touched.
    second = model_dir / SHARDS[1]
    os.truncate(second, 100)
    changed = f"weight file {second} changed since the loader opened it: rewritten in place"
    for call, request in [
        ("GetManifest", loader_pb2.GetManifestRequest()),
        ("GetResidency", loader_pb2.GetResidencyRequest()),
        ("Prefetch", loader_pb2.PrefetchRequest()),
    ]:
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                getattr(loader_pb2_grpc.LoaderStub(channel), call)(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, call
        assert changed in info.value.details(), call
    assert health(address) == health_pb2.HealthCheckResponse.SERVING
    assert process.poll() is None

    scheduler = run_scheduler(address, model_dir.parent)
    assert scheduler.returncode == 2, scheduler.stderr
    last = scheduler.stderr.strip().splitlines()[-1]
    assert last.startswith(f"zerolayer scheduler: error: --loader {address}: the loader refused")
    assert changed in last
    assert "Traceback" not in scheduler.stderr
