"""Tests for the --device flag: parsing, resolution against the devices present, fd socket paths."""

from __future__ import annotations

import pytest

from zerolayer.common.device import Device, fd_socket_path, parse_device, resolve_device


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("cpu", ("cpu", None)),
        ("auto", ("auto", None)),
        ("cuda", ("cuda", None)),
        ("cuda:3", ("cuda", 3)),
        (" CUDA:1 ", ("cuda", 1)),
    ],
)
def test_parse_accepts_the_documented_spellings(spec: str, parsed: tuple) -> None:
    assert parse_device(spec) == parsed


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:-1", "cpu:0", "auto:1", "cuda:x", ""])
def test_parse_rejects_anything_else_naming_the_flag(spec: str) -> None:
    with pytest.raises(ValueError, match="--device"):
        parse_device(spec)


def test_cpu_never_asks_for_cuda() -> None:
    def no_cuda() -> int:
        raise AssertionError("cpu must not probe CUDA")

    assert resolve_device("cpu", no_cuda) == Device("cpu")


def test_auto_falls_back_to_the_cpu_and_picks_gpu_zero_when_present() -> None:
    assert resolve_device("auto", lambda: 0) == Device("cpu")
    assert resolve_device("auto", lambda: 2) == Device("cuda", 0)


def test_an_explicit_gpu_that_is_missing_is_an_error_not_a_fallback() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda", lambda: 0)
    with pytest.raises(ValueError, match="has 2 CUDA device"):
        resolve_device("cuda:2", lambda: 2)
    assert resolve_device("cuda:1", lambda: 2) == Device("cuda", 1)
    assert str(resolve_device("cuda", lambda: 1)) == "cuda:0"


def test_fd_socket_sits_beside_a_unix_socket_else_in_tmp() -> None:
    assert fd_socket_path("unix:/run/zl/loader.sock", "loader", 7) == "/run/zl/loader.sock.fds"
    assert fd_socket_path("unix:///run/zl/kv.sock", "kvstore", 7) == "/run/zl/kv.sock.fds"
    assert fd_socket_path("127.0.0.1:5000", "loader", 42).endswith("zerolayer-loader-42.fds")
