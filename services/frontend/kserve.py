"""Thin handlers of the KServe v2 / Open Inference Protocol gRPC API
(``inference.GRPCInferenceService``, with Triton's ``ModelStreamInfer``) over a
:class:`TextGenerator`, so Triton and KServe clients work unchanged.

Tensors are named the way Triton's LLM backends name them (vLLM backend, TensorRT-LLM ensemble):
``text_input`` (BYTES, one element, shape [1] or [1, 1]) in, ``text_output`` (BYTES, same shape,
sent in ``raw_output_contents``) out. Sampling settings come from, later overriding earlier:
request ``parameters``, the ``sampling_parameters`` input (JSON, vLLM style; numbers may be given
as strings), then the scalar inputs ``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``seed``/``random_seed``, ``stop``/``stop_words``, ``ignore_eos``. ``stream`` (BOOL) makes
``ModelStreamInfer`` answer once per generated piece; the last answer carries the bool parameter
``triton_final_response`` = true (and ``finish_reason``, ``num_input_tokens``,
``num_output_tokens``). The prompt is not echoed unless ``exclude_input_in_output`` is false.
Spec: https://github.com/kserve/open-inference-protocol and Triton's grpc_service.proto.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import grpc
import numpy as np

from services.common.errors import InvalidArgument, NotFound, ZerolayerError
from services.common.generation import FinishReason, GenerateParams, GenerationChunk
from services.common.server import ServiceBinding
from services.frontend.generation import TextGenerator
from zerolayer.kserve.v2 import grpc_service_pb2 as pb
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MODEL_VERSION = "1"
"""The only version served (requests may also leave the version empty)."""
FINAL_RESPONSE_PARAM = "triton_final_response"
"""Response parameter Triton sets on a decoupled model's last response to a request."""

_INT_DTYPES = {
    **{f"INT{b}": np.dtype(f"<i{b // 8}") for b in (8, 16, 32, 64)},
    **{f"UINT{b}": np.dtype(f"<u{b // 8}") for b in (8, 16, 32, 64)},
}
_FLOAT_DTYPES = {f"FP{b}": np.dtype(f"<f{b // 8}") for b in (16, 32, 64)}
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "BYTES": "bytes_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
_KIND_DTYPES = {
    "uint": set(_INT_DTYPES),
    "float": set(_FLOAT_DTYPES),
    "bool": {"BOOL"},
    "strings": {"BYTES"},
}
_SETTINGS = {
    "max_tokens": "uint",
    "temperature": "float",
    "top_p": "float",
    "top_k": "uint",
    "seed": "uint",
    "stop": "strings",
    "ignore_eos": "bool",
    "stream": "bool",
    "exclude_input_in_output": "bool",
}
"""Settings a request may give, by kind; ``_ALIASES`` maps TensorRT-LLM's names onto them."""
_ALIASES = {"random_seed": "seed", "stop_words": "stop"}
_METADATA_DTYPE = {"uint": "INT32", "float": "FP32", "bool": "BOOL", "strings": "BYTES"}
"""Datatype ModelMetadata lists per kind (any integer type is accepted; seeds are UINT64)."""


def kserve_binding(generator: TextGenerator) -> ServiceBinding:
    """The binding that serves ``inference.GRPCInferenceService`` over ``generator``."""
    name = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
    return ServiceBinding(
        pb_grpc.add_GRPCInferenceServiceServicer_to_server, KServeServicer(generator), name
    )


def _maps_domain_errors(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    # NOTE: the server's ErrorMappingInterceptor only wraps "/zerolayer." methods, so this
    # service's unary handlers turn domain errors into statuses themselves.
    @functools.wraps(handler)
    async def mapped(self: KServeServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except (ZerolayerError, grpc.aio.AioRpcError) as exc:
            code, message = _status_of(exc)
            await context.abort(code, message)

    return mapped


@dataclass(frozen=True)
class _TextRequest:
    """A ModelInferRequest read into generation terms."""

    params: GenerateParams
    stream: bool
    echo_prompt: bool
    output_shape: tuple[int, ...]


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over a :class:`TextGenerator` (one model, version "1")."""

    def __init__(self, generator: TextGenerator) -> None:
        self._generator = generator
        self._model = generator.served.name
        try:
            self._version = metadata.version("zerolayer")
        except metadata.PackageNotFoundError:
            self._version = "unknown"

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        ready = request.name == self._model and request.version in ("", MODEL_VERSION)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="zerolayer", version=self._version, extensions=[])

    @_maps_domain_errors
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        self._check_model(request.name, request.version, "name", "version")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        inputs = [tensor(name="text_input", datatype="BYTES", shape=[-1])]
        inputs.append(tensor(name="sampling_parameters", datatype="BYTES", shape=[1]))
        for name, kind in [*_SETTINGS.items(), *((a, _SETTINGS[k]) for a, k in _ALIASES.items())]:
            shape = [-1] if kind == "strings" else [1]
            dtype = "UINT64" if name.endswith("seed") else _METADATA_DTYPE[kind]
            inputs.append(tensor(name=name, datatype=dtype, shape=shape))
        return pb.ModelMetadataResponse(
            name=self._model,
            versions=[MODEL_VERSION],
            platform="zerolayer",
            inputs=inputs,
            outputs=[tensor(name="text_output", datatype="BYTES", shape=[-1])],
        )

    @_maps_domain_errors
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        """The whole generated text in one response (``stream`` is ignored here)."""
        text_request = self._read(request)
        pieces, last = [], None
        async for chunk in self._generator.generate(text_request.params, context.time_remaining()):
            pieces.append(chunk.text)
            last = chunk
        text = self._prefix(text_request) + "".join(pieces)
        return self._response(request, text_request, text, last, final=None)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Serves requests concurrently as they arrive; responses of different requests may
        interleave (each echoes its request's ``id``). Errors become ``error_message`` responses.
        """
        responses: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest) -> None:
            async for response in self._stream_one(request, context.time_remaining()):
                await responses.put(response)

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(serve(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.wait(set(tasks))
            finally:
                await responses.put(None)

        reader = asyncio.create_task(read_requests())
        try:
            while (response := await responses.get()) is not None:
                yield response
        finally:
            # The client left (or everything is answered): closing the generations aborts them.
            for task in [reader, *tasks]:
                task.cancel()

    async def _stream_one(
        self, request: pb.ModelInferRequest, timeout_s: float | None
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            text_request = self._read(request)
            prefix, pieces = self._prefix(text_request), []
            async for chunk in self._generator.generate(text_request.params, timeout_s):
                final = chunk.finish_reason != FinishReason.UNSPECIFIED
                if not text_request.stream:
                    pieces.append(chunk.text)
                    if final:
                        text = prefix + "".join(pieces)
                        yield self._stream_response(request, text_request, text, chunk)
                elif chunk.text or final:
                    yield self._stream_response(request, text_request, prefix + chunk.text, chunk)
                    prefix = ""
        except (ZerolayerError, grpc.aio.AioRpcError) as exc:
            code, message = _status_of(exc)
            yield self._error_response(request, f"{code.name}: {message}")
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the stream
            log.exception("unexpected error in ModelStreamInfer")
            yield self._error_response(request, f"INTERNAL: {type(exc).__name__}: {exc}")

    def _error_response(
        self, request: pb.ModelInferRequest, message: str
    ) -> pb.ModelStreamInferResponse:
        infer_response = pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        )
        return pb.ModelStreamInferResponse(error_message=message, infer_response=infer_response)

    def _stream_response(
        self,
        request: pb.ModelInferRequest,
        text_request: _TextRequest,
        text: str,
        chunk: GenerationChunk,
    ) -> pb.ModelStreamInferResponse:
        final = chunk.finish_reason != FinishReason.UNSPECIFIED
        response = self._response(request, text_request, text, chunk, final=final)
        return pb.ModelStreamInferResponse(infer_response=response)

    def _response(
        self,
        request: pb.ModelInferRequest,
        text_request: _TextRequest,
        text: str,
        last: GenerationChunk | None,
        final: bool | None,
    ) -> pb.ModelInferResponse:
        output = pb.ModelInferResponse.InferOutputTensor(
            name="text_output", datatype="BYTES", shape=text_request.output_shape
        )
        response = pb.ModelInferResponse(
            model_name=self._model,
            model_version=MODEL_VERSION,
            id=request.id,
            outputs=[output],
            raw_output_contents=[_pack_bytes([text.encode()])],
        )
        if final is not None:
            response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
        if last is not None and last.finish_reason != FinishReason.UNSPECIFIED:
            response.parameters["finish_reason"].string_param = last.finish_reason.name.lower()
            if last.usage is not None:
                response.parameters["num_input_tokens"].int64_param = last.usage.prompt_tokens
                response.parameters["num_output_tokens"].int64_param = last.usage.completion_tokens
        return response

    def _prefix(self, text_request: _TextRequest) -> str:
        return (text_request.params.prompt or "") if text_request.echo_prompt else ""

    def _check_model(self, name: str, version: str, name_field: str, version_field: str) -> None:
        if name != self._model:
            raise NotFound(f"{name_field}: {name!r} is not served (serving {self._model!r})")
        if version not in ("", MODEL_VERSION):
            raise NotFound(
                f"{version_field}: {version!r} is not served (serving {MODEL_VERSION!r})"
            )

    def _read(self, request: pb.ModelInferRequest) -> _TextRequest:
        """Reads the request's tensors and settings.

        Raises:
            NotFound: another model or version.
            InvalidArgument: a missing, unknown, mistyped or malformed input or setting; the
                message starts with the input's (or ``parameters.KEY``'s) name.
        """
        self._check_model(request.model_name, request.model_version, "model_name", "model_version")
        for output in request.outputs:
            if output.name != "text_output":
                raise InvalidArgument("outputs", f"{output.name!r} unknown (only 'text_output')")
        settings: dict[str, Any] = {}
        for key, param in request.parameters.items():
            value = getattr(param, param.WhichOneof("parameter_choice") or "string_param")
            if _ALIASES.get(key, key) in _SETTINGS:  # others (priority, timeout...) are Triton's
                _set(settings, key, value, f"parameters.{key}")
        tensors = _read_tensors(request)
        if "sampling_parameters" in tensors:
            for key, value in _json_settings(*tensors.pop("sampling_parameters")).items():
                _set(settings, key, value, f"sampling_parameters.{key}")
        text_tensor = tensors.pop("text_input", None)
        if text_tensor is None:
            raise InvalidArgument("text_input", "missing (a BYTES input holding the prompt)")
        for name, (tensor, values) in tensors.items():
            kind = _SETTINGS[_ALIASES.get(name, name)]
            _check_dtype(name, tensor.datatype, kind)
            _set(settings, name, values if kind == "strings" else _one(name, values), name)
        return _TextRequest(
            params=GenerateParams(
                prompt=_prompt(*text_tensor),
                max_new_tokens=settings.get("max_tokens", 0),
                temperature=settings.get("temperature"),
                top_p=settings.get("top_p"),
                top_k=settings.get("top_k"),
                seed=settings.get("seed"),
                stop=tuple(s for s in settings.get("stop", ()) if s),
                ignore_eos=settings.get("ignore_eos", False),
                model=self._model,
            ),
            stream=settings.get("stream", False),
            echo_prompt=not settings.get("exclude_input_in_output", True),
            output_shape=tuple(text_tensor[0].shape) if len(text_tensor[0].shape) == 2 else (1,),
        )


def _status_of(exc: ZerolayerError | grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ZerolayerError):
        return exc.code, str(exc)
    return exc.code(), f"upstream layer: {exc.details()}"


Tensor = pb.ModelInferRequest.InferInputTensor


def _read_tensors(request: pb.ModelInferRequest) -> dict[str, tuple[Tensor, list[Any]]]:
    """Every input by name with its flat element list (raw contents decoded, counts checked)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(
            "raw_input_contents", f"{len(raw)} entries for {len(request.inputs)} inputs"
        )
    tensors: dict[str, tuple[Tensor, list[Any]]] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name not in ("text_input", "sampling_parameters", *_SETTINGS, *_ALIASES):
            raise InvalidArgument(name, "unknown input (see ModelMetadata for the accepted ones)")
        if name in tensors:
            raise InvalidArgument(name, "given twice")
        values = _decode(tensor, raw[i] if raw else None)
        if len(values) != math.prod(tensor.shape):
            raise InvalidArgument(name, f"{len(values)} elements for shape {list(tensor.shape)}")
        tensors[name] = (tensor, values)
    return tensors


def _decode(tensor: Tensor, raw: bytes | None) -> list[Any]:
    dtype, name = tensor.datatype, tensor.name
    if raw is None:
        if dtype not in _CONTENTS_FIELD:
            raise InvalidArgument(name, f"datatype {dtype!r} needs raw_input_contents")
        return list(getattr(tensor.contents, _CONTENTS_FIELD[dtype]))
    if dtype == "BYTES":
        return _unpack_bytes(raw, name)
    if dtype == "BOOL":
        return [b != 0 for b in raw]
    np_dtype = _INT_DTYPES.get(dtype) or _FLOAT_DTYPES.get(dtype)
    if np_dtype is None:
        raise InvalidArgument(name, f"datatype {dtype!r} not supported")
    if len(raw) % np_dtype.itemsize:
        raise InvalidArgument(name, f"{len(raw)} raw bytes is not a whole number of {dtype}")
    return np.frombuffer(raw, dtype=np_dtype).tolist()


def _unpack_bytes(raw: bytes, name: str) -> list[bytes]:
    """Splits raw BYTES contents: each element is a little-endian uint32 length, then the bytes."""
    items, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise InvalidArgument(name, "raw BYTES contents end inside a length prefix")
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise InvalidArgument(name, f"raw BYTES element of {size} bytes overruns the contents")
        items.append(raw[pos : pos + size])
        pos += size
    return items


def _pack_bytes(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _check_dtype(name: str, dtype: str, kind: str) -> None:
    if dtype not in _KIND_DTYPES[kind]:
        raise InvalidArgument(
            name, f"datatype {dtype}; expected one of {sorted(_KIND_DTYPES[kind])}"
        )


def _one(name: str, values: list[Any]) -> Any:
    if len(values) != 1:
        raise InvalidArgument(name, f"expected one element (batch size 1), got {len(values)}")
    return values[0]


def _prompt(tensor: Tensor, values: list[Any]) -> str:
    _check_dtype("text_input", tensor.datatype, "strings")
    data = _one("text_input", values)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise InvalidArgument("text_input", "not valid UTF-8") from None
    if not text:
        raise InvalidArgument("text_input", "empty")
    return text


def _json_settings(tensor: Tensor, values: list[Any]) -> dict[str, Any]:
    _check_dtype("sampling_parameters", tensor.datatype, "strings")
    try:
        settings = json.loads(_one("sampling_parameters", values))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument("sampling_parameters", f"not valid JSON: {exc}") from None
    if not isinstance(settings, dict):
        raise InvalidArgument("sampling_parameters", "must be a JSON object")
    for key in settings:
        if _ALIASES.get(key, key) not in _SETTINGS:
            raise InvalidArgument(f"sampling_parameters.{key}", "not supported")
    return settings


def _set(settings: dict[str, Any], key: str, value: Any, field: str) -> None:
    """Stores ``value`` under the canonical name of ``key``, converted to its kind (numbers and
    booleans may arrive as strings, as vLLM backend clients send them)."""
    canonical = _ALIASES.get(key, key)
    kind = _SETTINGS[canonical]
    try:
        settings[canonical] = _convert(kind, value)
    except (TypeError, ValueError):
        expected = {"uint": "an integer >= 0", "float": "a number", "bool": "a boolean"}
        reason = expected.get(kind, "a string or a list of strings")
        raise InvalidArgument(field, f"must be {reason}, got {value!r}") from None


def _convert(kind: str, value: Any) -> Any:
    if kind == "strings":
        if isinstance(value, str) and value.startswith("["):
            value = json.loads(value)
        items = [value] if isinstance(value, (str, bytes)) else list(value)
        if not all(isinstance(s, (str, bytes)) for s in items):
            raise TypeError("not strings")
        return [s.decode() if isinstance(s, bytes) else s for s in items]
    if isinstance(value, str):
        value = value.strip()
        if kind == "bool":
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        value = float(value) if kind == "float" else int(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError("not a boolean")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("not a number")
    if kind == "float":
        return float(value)
    if isinstance(value, float) and not value.is_integer() or value < 0:
        raise ValueError("not an integer >= 0")
    return int(value)
