"""The KServe v2 tensor codec: inputs of a ``ModelInferRequest`` read into Python values and
``BYTES`` outputs packed, for the text-generation handlers in
:mod:`zerolayer.frontend.kserve.server`.

Contents come either typed (``contents.*_contents``) or raw (``raw_input_contents``: little-endian
values; ``BYTES`` elements each prefixed by a uint32 length).
Spec: https://github.com/kserve/open-inference-protocol (Tensor Data, Raw Input/Output Contents).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from zerolayer.common.errors import InvalidArgument
from zerolayer.kserve.v2 import grpc_service_pb2 as pb

# NOTE: struct formats, not numpy (about 0.15 s of every frontend start-up for these alone)
_INT_DTYPES = {
    **{f"INT{b}": code for b, code in zip((8, 16, 32, 64), "bhiq", strict=True)},
    **{f"UINT{b}": code for b, code in zip((8, 16, 32, 64), "BHIQ", strict=True)},
}
_FLOAT_DTYPES = {f"FP{b}": code for b, code in zip((16, 32, 64), "efd", strict=True)}
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
    "uints": set(_INT_DTYPES),
    "string": {"BYTES"},
    "json": {"BYTES"},
    "bias": {"BYTES"},
}


Tensor = pb.ModelInferRequest.InferInputTensor
"""One input tensor of a ModelInferRequest."""


def read_tensors(
    request: pb.ModelInferRequest, accepted_names: frozenset[str]
) -> dict[str, tuple[Tensor, list[Any]]]:
    """Every input by name with its flat element list (raw contents decoded, counts checked).

    Raises:
        InvalidArgument: an input not in ``accepted_names``, given twice, of an unsupported
            datatype, or whose element count does not match its shape; the message starts with
            the input's name (or ``raw_input_contents``); or whose shape is not ``[n]`` or
            ``[1, n]`` (batch size 1, n >= 0; see :func:`_check_shape`), naming
            ``inputs[i].shape``.
    """
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(
            "raw_input_contents", f"{len(raw)} entries for {len(request.inputs)} inputs"
        )
    tensors: dict[str, tuple[Tensor, list[Any]]] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name not in accepted_names:
            raise InvalidArgument(name, "unknown input (see ModelMetadata for the accepted ones)")
        if name in tensors:
            raise InvalidArgument(name, "given twice")
        _check_shape(i, tensor)
        values = _decode(tensor, raw[i] if raw else None)
        if len(values) != math.prod(tensor.shape):
            raise InvalidArgument(name, f"{len(values)} elements for shape {list(tensor.shape)}")
        tensors[name] = (tensor, values)
    return tensors


def _check_shape(index: int, tensor: Tensor) -> None:
    """Refuses a shape other than ``[n]`` or ``[1, n]`` with n >= 0: one request (batch size 1)
    of n elements, the way Triton's LLM backends lay out each input (``text_input`` and each
    setting hold one element, ``stop`` one per string; their readers check n).

    Raises:
        InvalidArgument: naming ``inputs[index].shape``.
    """
    shape = list(tensor.shape)
    if len(shape) not in (1, 2) or shape[-1] < 0 or (len(shape) == 2 and shape[0] != 1):
        raise InvalidArgument(
            f"inputs[{index}].shape",
            f"{shape} for {tensor.name!r}: must be [n] or [1, n] (batch size 1, n >= 0)",
        )


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
    code = _INT_DTYPES.get(dtype) or _FLOAT_DTYPES.get(dtype)
    if code is None:
        raise InvalidArgument(name, f"datatype {dtype!r} not supported")
    itemsize = struct.calcsize(f"<{code}")
    if len(raw) % itemsize:
        raise InvalidArgument(name, f"{len(raw)} raw bytes is not a whole number of {dtype}")
    return list(struct.unpack(f"<{len(raw) // itemsize}{code}", raw))


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


def pack_bytes(items: list[bytes]) -> bytes:
    """Raw BYTES contents of ``items``: each a little-endian uint32 length, then the bytes."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def check_dtype(name: str, dtype: str, kind: str) -> None:
    """Raises InvalidArgument (naming ``name``) unless ``dtype`` holds values of ``kind``
    (``uint``, ``float``, ``bool``, ``strings``, ``uints``, ``string``, ``json`` or ``bias``)."""
    if dtype not in _KIND_DTYPES[kind]:
        raise InvalidArgument(
            name, f"datatype {dtype}; expected one of {sorted(_KIND_DTYPES[kind])}"
        )
