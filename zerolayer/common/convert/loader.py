"""Conversion of the loader's messages (``zerolayer.v1.Loader``)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest

from zerolayer.common.errors import InvalidArgument
from zerolayer.sharing.file_identity import FileIdentity
from zerolayer.sharing.manifest import (
    DeviceMemoryHandle,
    HandleKind,
    Residency,
    TensorSpec,
    WeightManifest,
)
from zerolayer.v1 import loader_pb2


def manifest_request_to_pb(
    accepted: Sequence[HandleKind], model: str = ""
) -> loader_pb2.GetManifestRequest:
    """A GetManifest request from an importer that maps the ``accepted`` kinds (best first)."""
    return loader_pb2.GetManifestRequest(
        model=model, accepted_handle_kinds=[int(k) for k in accepted]
    )


def manifest_request_from_pb(pb: loader_pb2.GetManifestRequest) -> tuple[str, list[HandleKind]]:
    """(model, accepted handle kinds) of a GetManifest request.

    Raises:
        InvalidArgument: an accepted kind that is not a HandleKind (``accepted_handle_kinds``).
    """
    return pb.model, [_handle_kind(k) for k in pb.accepted_handle_kinds]


def _handle_kind(value: int) -> HandleKind:
    try:
        return HandleKind(value)
    except ValueError:
        raise InvalidArgument("accepted_handle_kinds", f"unknown handle kind {value}") from None


def residency_request_to_pb() -> loader_pb2.GetResidencyRequest:
    """A GetResidency request (it has no fields)."""
    return loader_pb2.GetResidencyRequest()


def residency_to_pb(r: Residency) -> loader_pb2.Residency:
    """Domain residency to its wire form."""
    return loader_pb2.Residency(
        total_bytes=r.total_bytes,
        resident_bytes=r.resident_bytes,
        num_layers=r.num_layers,
        num_layers_resident=r.num_layers_resident,
        device=r.device,
    )


def residency_from_pb(pb: loader_pb2.Residency) -> Residency:
    """Wire residency to the domain form."""
    return Residency(
        total_bytes=pb.total_bytes,
        resident_bytes=pb.resident_bytes,
        num_layers=pb.num_layers,
        num_layers_resident=pb.num_layers_resident,
        device=pb.device,
    )


def _weight_file_to_pb(
    path: str, size_bytes: int, identity: FileIdentity | None
) -> loader_pb2.WeightFile:
    if identity is None:
        return loader_pb2.WeightFile(path=path, size_bytes=size_bytes)
    return loader_pb2.WeightFile(
        path=path,
        size_bytes=size_bytes,
        device_id=identity.device_id,
        inode=identity.inode,
        mtime_ns=identity.mtime_ns,
    )


def manifest_to_pb(m: WeightManifest) -> loader_pb2.ModelManifest:
    """Domain manifest to its wire form."""
    return loader_pb2.ModelManifest(
        model=m.model,
        model_dir=m.model_dir,
        config_json=m.config_json,
        generation_config_json=m.generation_config_json,
        tokenizer_json=m.tokenizer_json,
        tokenizer_config_json=m.tokenizer_config_json,
        chat_template_jinja=m.chat_template_jinja,
        fingerprint=m.fingerprint,
        handle_kind=int(m.handle_kind),
        files=[
            _weight_file_to_pb(p, s, i)
            for p, s, i in zip_longest(m.files, m.file_sizes, m.file_identities)
        ],
        tensors=[
            loader_pb2.TensorHandle(
                name=t.name,
                dtype=t.dtype,
                shape=t.shape,
                file_index=t.file_index,
                offset_bytes=t.offset_bytes,
                nbytes=t.nbytes,
                device_offset_bytes=t.device_offset_bytes,
            )
            for t in m.tensors
        ],
        num_parameters=m.num_parameters,
        device_memory=(
            device_memory_to_pb(m.device_memory) if m.device_memory is not None else None
        ),
    )


def manifest_from_pb(pb: loader_pb2.ModelManifest) -> WeightManifest:
    """Wire manifest to the domain form."""
    return WeightManifest(
        model=pb.model,
        model_dir=pb.model_dir,
        config_json=pb.config_json,
        generation_config_json=pb.generation_config_json,
        tokenizer_json=pb.tokenizer_json,
        tokenizer_config_json=pb.tokenizer_config_json,
        chat_template_jinja=pb.chat_template_jinja,
        fingerprint=pb.fingerprint,
        handle_kind=HandleKind(pb.handle_kind),
        files=tuple(f.path for f in pb.files),
        file_sizes=tuple(f.size_bytes for f in pb.files),
        file_identities=tuple(
            FileIdentity(f.device_id, f.inode, f.size_bytes, f.mtime_ns) for f in pb.files
        )
        if all(f.inode for f in pb.files)
        else (),
        tensors=tuple(
            TensorSpec(
                t.name,
                t.dtype,
                tuple(t.shape),
                t.file_index,
                t.offset_bytes,
                t.nbytes,
                t.device_offset_bytes,
            )
            for t in pb.tensors
        ),
        num_parameters=pb.num_parameters,
        device_memory=(
            device_memory_from_pb(pb.device_memory) if pb.HasField("device_memory") else None
        ),
    )


def device_memory_to_pb(h: DeviceMemoryHandle) -> loader_pb2.DeviceMemoryHandle:
    """Domain device-memory handle to its wire form."""
    return loader_pb2.DeviceMemoryHandle(
        kind=int(h.kind),
        device=h.device,
        gpu_uuid=h.gpu_uuid,
        size_bytes=h.size_bytes,
        ipc_handle=h.ipc_handle,
        fd_socket=h.fd_socket,
        handle_id=h.handle_id,
    )


def device_memory_from_pb(pb: loader_pb2.DeviceMemoryHandle) -> DeviceMemoryHandle:
    """Wire device-memory handle to the domain form."""
    return DeviceMemoryHandle(
        kind=HandleKind(pb.kind),
        device=pb.device,
        gpu_uuid=pb.gpu_uuid,
        size_bytes=pb.size_bytes,
        ipc_handle=pb.ipc_handle,
        fd_socket=pb.fd_socket,
        handle_id=pb.handle_id,
    )
