"""The KServe v2 tensor codec, on requests built directly (no server)."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from factories import make_tensor_request

from zerolayer.common.errors import InvalidArgument
from zerolayer.frontend.kserve.tensors import check_dtype, pack_bytes, read_tensors

ACCEPTED = frozenset({"text_input", "max_tokens", "temperature", "ignore_eos"})


def test_raw_contents_of_each_kind_decode_to_exact_values() -> None:
    request = make_tensor_request(
        ("text_input", "BYTES", [1, 2]),
        ("max_tokens", "UINT16", [1]),
        ("temperature", "FP16", [1]),
        ("ignore_eos", "BOOL", [1]),
        raw=[
            pack_bytes([b"hi", b""]),
            struct.pack("<H", 513),
            np.array([0.5], dtype="<f2").tobytes(),
            b"\x01",
        ],
    )
    tensors = read_tensors(request, ACCEPTED)
    assert {name: values for name, (_, values) in tensors.items()} == {
        "text_input": [b"hi", b""],
        "max_tokens": [513],
        "temperature": [0.5],
        "ignore_eos": [True],
    }


def test_typed_contents_decode_without_raw() -> None:
    request = make_tensor_request(("max_tokens", "INT64", [2]))
    request.inputs[0].contents.int64_contents.extend([7, 9])
    assert read_tensors(request, ACCEPTED)["max_tokens"][1] == [7, 9]


def test_pack_bytes_prefixes_each_element_with_its_little_endian_length() -> None:
    assert pack_bytes([b"ab", b""]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (make_tensor_request(("top_k", "INT32", [1]), raw=[b"\0" * 4]), "top_k: unknown input"),
        (
            make_tensor_request(
                ("max_tokens", "INT32", [1]), ("max_tokens", "INT32", [1]), raw=[b"\0" * 4] * 2
            ),
            "max_tokens: given twice",
        ),
        (
            make_tensor_request(("max_tokens", "INT32", [2]), raw=[b"\0" * 4]),
            "1 elements for shape",
        ),
        (
            make_tensor_request(("max_tokens", "INT32", [1]), raw=[b"\0" * 3]),
            "whole number of INT32",
        ),
        (make_tensor_request(("text_input", "BYTES", [1]), raw=[b"\x05\0\0\0ab"]), "overruns"),
        (
            make_tensor_request(("text_input", "BYTES", [1]), raw=[b"\x05\0"]),
            "inside a length prefix",
        ),
        (make_tensor_request(("max_tokens", "INT32", [1])), "max_tokens: 0 elements for shape [1]"),
        (make_tensor_request(("text_input", "FP8", [1]), raw=[b"\0"]), "FP8' not supported"),
        (
            make_tensor_request(
                ("max_tokens", "INT32", [1]), ("text_input", "BYTES", [1]), raw=[b""]
            ),
            "raw_input_contents: 1 entries for 2 inputs",
        ),
    ],
)
def test_malformed_inputs_are_invalid_argument_naming_the_input(request_, message) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        read_tensors(request_, ACCEPTED)


def test_check_dtype_names_the_input_and_the_accepted_datatypes() -> None:
    check_dtype("ignore_eos", "BOOL", "bool")
    with pytest.raises(
        InvalidArgument, match=r"ignore_eos: datatype INT8; expected one of \['BOOL'\]"
    ):
        check_dtype("ignore_eos", "INT8", "bool")
