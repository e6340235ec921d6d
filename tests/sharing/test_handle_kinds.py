"""Tests for handle_kinds: negotiation order, offered and accepted kinds per device."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.common.errors import FailedPrecondition
from zerolayer.loader.weight_store import WeightStore
from zerolayer.sharing import cuda_driver
from zerolayer.sharing.handle_kinds import importer_kinds, negotiate, offered_kinds
from zerolayer.sharing.manifest import HandleKind

MMAP = HandleKind.MMAP_FILE
IPC = HandleKind.CUDA_IPC
VMM = HandleKind.CUDA_VMM_FD
TINY_PRESET = DummyPreset(
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    vocab_size=259,
    max_position_embeddings=64,
    dtype="float32",
)


def make_weight_store(tmp_path: Path) -> WeightStore:
    """A loader's weight store over a complete tiny checkpoint (the loader checks every tensor)."""
    return WeightStore(write_dummy_model(tmp_path / "tiny", TINY_PRESET))


def fake_vmm_support(monkeypatch: pytest.MonkeyPatch, supported: bool) -> list[int]:
    """Replaces the device query; returns the device indices it was asked about."""
    asked: list[int] = []

    def vmm_fd_supported(device_index: int) -> bool:
        asked.append(device_index)
        return supported

    monkeypatch.setattr(cuda_driver, "vmm_fd_supported", vmm_fd_supported)
    return asked


@pytest.mark.parametrize(
    ("accepted", "offered", "expected"),
    [
        ((), (MMAP,), MMAP),  # empty accepted means MMAP_FILE
        ((MMAP,), (MMAP,), MMAP),
        ((VMM, IPC), (VMM, IPC), VMM),
        ((IPC, VMM), (VMM, IPC), IPC),  # the importer's order wins
        ((VMM, IPC, MMAP), (IPC,), IPC),
        ((VMM, IPC, MMAP), (MMAP,), MMAP),
        ((HandleKind.UNSPECIFIED, MMAP), (MMAP,), MMAP),
        ([2], (IPC,), IPC),  # plain ints from the wire
    ],
)
def test_negotiate_picks_the_importers_first_offered_kind(
    accepted: tuple[HandleKind, ...], offered: tuple[HandleKind, ...], expected: HandleKind
) -> None:
    kind = negotiate(accepted, offered)
    assert kind == expected
    assert type(kind) is HandleKind


@pytest.mark.parametrize(
    ("accepted", "offered", "message"),
    [
        ((), (VMM, IPC), "accepted_handle_kinds: none is offered (offered: CUDA_VMM_FD, CUDA_IPC)"),
        ((VMM,), (MMAP,), "accepted_handle_kinds: none is offered (offered: MMAP_FILE)"),
        ((IPC, MMAP), (VMM,), "accepted_handle_kinds: none is offered (offered: CUDA_VMM_FD)"),
        ((MMAP,), (), "accepted_handle_kinds: none is offered (offered: nothing)"),
    ],
)
def test_negotiate_fails_naming_the_field_and_the_offer(
    accepted: tuple[HandleKind, ...], offered: tuple[HandleKind, ...], message: str
) -> None:
    with pytest.raises(FailedPrecondition) as info:
        negotiate(accepted, offered)
    assert str(info.value) == message


def test_cpu_kinds() -> None:
    assert offered_kinds("cpu") == (MMAP,)
    assert importer_kinds("cpu") == (MMAP,)


@pytest.mark.parametrize(("device", "index"), [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_cuda_kinds_with_vmm_fd_support(
    monkeypatch: pytest.MonkeyPatch, device: str, index: int
) -> None:
    asked = fake_vmm_support(monkeypatch, True)
    assert offered_kinds(device) == (VMM, IPC)
    assert importer_kinds(device) == (VMM, IPC, MMAP)
    assert asked == [index, index]


def test_cuda_kinds_without_vmm_fd_support(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = fake_vmm_support(monkeypatch, False)
    assert offered_kinds("cuda:1") == (IPC,)
    assert importer_kinds("cuda:1") == (IPC, MMAP)
    assert asked == [1, 1]


def test_a_cuda_importer_still_works_with_a_cpu_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_vmm_support(monkeypatch, True)
    assert negotiate(importer_kinds("cuda:0"), offered_kinds("cpu")) == MMAP
    assert negotiate(importer_kinds("cuda:0"), offered_kinds("cuda:0")) == VMM


@pytest.mark.parametrize("device", ["auto", "gpu", "cuda:", "cuda:x", "CPU", "cpu:0", ""])
def test_unknown_devices_are_rejected(device: str) -> None:
    with pytest.raises(ValueError, match="is not one of cpu, cuda, cuda:N"):
        offered_kinds(device)
    with pytest.raises(ValueError, match="is not one of cpu, cuda, cuda:N"):
        importer_kinds(device)


def test_cuda_kinds_need_cuda_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.bindings.runtime"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(RuntimeError, match="cuda-bindings"):
        offered_kinds("cuda:0")


def test_weight_store_negotiates_with_the_importer(tmp_path: Path) -> None:
    store = make_weight_store(tmp_path)
    try:
        assert store.get_manifest("", []).handle_kind == MMAP
        assert store.get_manifest("tiny", [VMM, MMAP]).handle_kind == MMAP
        with pytest.raises(FailedPrecondition) as info:
            store.get_manifest("", [VMM, IPC])
        assert str(info.value) == "accepted_handle_kinds: none is offered (offered: MMAP_FILE)"
    finally:
        store.close()
