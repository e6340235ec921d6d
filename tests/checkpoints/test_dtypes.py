"""Safetensors dtype names: sizes, torch dtypes, and the torch names the public API reports."""

from __future__ import annotations

import pytest

from zerolayer.checkpoints.dtypes import ITEM_SIZES, dtype_name, itemsize, torch_dtype, torch_name


def test_torch_names_are_what_torch_calls_the_dtypes() -> None:
    assert (torch_name("BF16"), torch_name("F16"), torch_name("F32")) == (
        "bfloat16",
        "float16",
        "float32",
    )
    for name in ITEM_SIZES:
        assert str(torch_dtype(name)) == f"torch.{torch_name(name)}"
        assert torch_dtype(name).itemsize == itemsize(name)
        assert dtype_name(torch_dtype(name)) == name


@pytest.mark.parametrize("convert", [torch_name, torch_dtype, itemsize])
def test_unknown_names_are_value_errors(convert) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="unsupported safetensors dtype 'F8_E4M3'"):
        convert("F8_E4M3")
