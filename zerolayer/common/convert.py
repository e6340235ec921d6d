"""The one module that converts between protobuf messages and domain objects."""

from __future__ import annotations

from zerolayer.common.generation import (
    EngineRequest,
    FinishReason,
    GenerateParams,
    GenerationChunk,
    RequestOutput,
    SamplingParams,
)
from zerolayer.sharing.manifest import DeviceMemoryHandle, HandleKind, TensorSpec, WeightManifest
from zerolayer.v1 import generation_pb2, loader_pb2, scheduler_pb2


def manifest_to_pb(m: WeightManifest) -> loader_pb2.ModelManifest:
    """Domain manifest to its wire form."""
    return loader_pb2.ModelManifest(
        model=m.model,
        model_dir=m.model_dir,
        config_json=m.config_json,
        generation_config_json=m.generation_config_json,
        tokenizer_json=m.tokenizer_json,
        tokenizer_config_json=m.tokenizer_config_json,
        fingerprint=m.fingerprint,
        handle_kind=int(m.handle_kind),
        files=[
            loader_pb2.WeightFile(path=p, size_bytes=s)
            for p, s in zip(m.files, m.file_sizes, strict=True)
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
        fingerprint=pb.fingerprint,
        handle_kind=HandleKind(pb.handle_kind),
        files=tuple(f.path for f in pb.files),
        file_sizes=tuple(f.size_bytes for f in pb.files),
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


def engine_request_to_pb(r: EngineRequest) -> scheduler_pb2.EngineRequest:
    """Domain request to the scheduler's wire form."""
    s = r.sampling
    return scheduler_pb2.EngineRequest(
        request_id=r.request_id,
        prompt_token_ids=r.prompt_token_ids,
        max_new_tokens=r.max_new_tokens,
        ignore_eos=r.ignore_eos,
        cache_salt=r.cache_salt,
        sampling=scheduler_pb2.SamplingParams(
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed
        ),
    )


def engine_request_from_pb(pb: scheduler_pb2.EngineRequest) -> EngineRequest:
    """Wire request to the domain form."""
    s = pb.sampling
    return EngineRequest(
        request_id=pb.request_id,
        prompt_token_ids=tuple(pb.prompt_token_ids),
        max_new_tokens=pb.max_new_tokens,
        ignore_eos=pb.ignore_eos,
        cache_salt=pb.cache_salt,
        sampling=SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=s.seed if s.HasField("seed") else None,
        ),
    )


def request_output_to_pb(o: RequestOutput) -> scheduler_pb2.EngineOutput:
    """Domain step output to the wire form."""
    return scheduler_pb2.EngineOutput(
        new_token_ids=o.new_token_ids,
        finish_reason=int(o.finish_reason),
        num_prompt_tokens=o.num_prompt_tokens,
        num_cached_tokens=o.num_cached_tokens,
    )


def request_output_from_pb(request_id: str, pb: scheduler_pb2.EngineOutput) -> RequestOutput:
    """Wire step output to the domain form."""
    return RequestOutput(
        request_id,
        tuple(pb.new_token_ids),
        FinishReason(pb.finish_reason),
        pb.num_prompt_tokens,
        pb.num_cached_tokens,
    )


def generate_params_from_pb(pb: generation_pb2.GenerateRequest) -> GenerateParams:
    """Public request to the domain form; unset optional fields become None."""
    which = pb.WhichOneof("input")
    return GenerateParams(
        prompt=pb.prompt if which == "prompt" else None,
        prompt_token_ids=tuple(pb.prompt_token_ids.ids) if which == "prompt_token_ids" else None,
        max_new_tokens=pb.max_new_tokens,
        temperature=pb.temperature if pb.HasField("temperature") else None,
        top_p=pb.top_p if pb.HasField("top_p") else None,
        top_k=pb.top_k if pb.HasField("top_k") else None,
        seed=pb.seed if pb.HasField("seed") else None,
        stop=tuple(pb.stop),
        ignore_eos=pb.ignore_eos,
        cache_salt=pb.cache_salt,
        request_id=pb.request_id,
        model=pb.model,
    )


def chunk_to_pb(c: GenerationChunk) -> generation_pb2.GenerateResponse:
    """A generation chunk to a public response (usage only when the chunk carries it)."""
    pb = generation_pb2.GenerateResponse(
        text=c.text,
        token_ids=c.token_ids,
        finish_reason=int(c.finish_reason),
        request_id=c.request_id,
    )
    if c.usage is not None:
        pb.usage.CopyFrom(
            generation_pb2.Usage(
                prompt_tokens=c.usage.prompt_tokens,
                completion_tokens=c.usage.completion_tokens,
                cached_prompt_tokens=c.usage.cached_prompt_tokens,
            )
        )
    return pb
