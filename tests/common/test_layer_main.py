"""The process edge the four layer programs share: flags to config, exit codes."""

from __future__ import annotations

import importlib

import pytest

from zerolayer.common.config import KVStoreConfig
from zerolayer.common.layer_main import LayerProgram, main
from zerolayer.common.server import LAUNCHER_PID_ENV, BindError
from zerolayer.common.settings import KV_CACHE_BYTES, LAYERS
from zerolayer.common.tracing import Tracing
from zerolayer.kv.arena_file import ArenaSizeError

KVSTORE_FLAGS = ["--address", "unix:/run/x.sock", "--loader", "unix:/run/l.sock"]
KVSTORE_FLAGS += ["--shm-path", "/dev/shm/x.kv", "--kv-cache-bytes", "4096"]


def make_program(error: Exception | None, seen: list[KVStoreConfig]) -> LayerProgram:
    """A kvstore program whose serve records its config, then raises ``error`` (if any)."""

    async def serve(config: KVStoreConfig, tracing: Tracing) -> None:
        seen.append(config)
        if error is not None:
            raise error

    return LayerProgram(
        "kvstore", KVStoreConfig, serve, setting_errors=((ArenaSizeError, KV_CACHE_BYTES),)
    )


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)


def test_serve_gets_the_config_of_the_flags_and_a_clean_return_is_exit_code_0() -> None:
    seen: list[KVStoreConfig] = []
    assert main(make_program(None, seen), KVSTORE_FLAGS) == 0
    assert seen == [
        KVStoreConfig(
            address="unix:/run/x.sock",
            loader_address="unix:/run/l.sock",
            shm_path="/dev/shm/x.kv",
            kv_cache_bytes=4096,
        )
    ]


def test_a_setting_error_is_one_line_naming_the_flag_and_its_value_and_exit_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = ArenaSizeError("the KV arena needs 4096 bytes at /dev/shm/x.kv, but only 7 are free")
    assert main(make_program(error, []), KVSTORE_FLAGS) == 2
    assert capsys.readouterr().err == (
        "zerolayer kvstore: error: --kv-cache-bytes 4096: the KV arena needs 4096 bytes at "
        "/dev/shm/x.kv, but only 7 are free\n"
    )


def test_the_frontend_refuses_an_unreadable_tls_file_at_once_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    program = importlib.import_module("zerolayer.frontend.__main__").PROGRAM
    flags = ["--loader", "unix:/nonexistent/l.sock", "--scheduler", "unix:/nonexistent/s.sock"]
    flags += ["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"]
    assert main(program, flags) == 2
    assert capsys.readouterr().err == (
        "zerolayer frontend: error: --tls-cert /nonexistent.pem: cannot read /nonexistent.pem: "
        "No such file or directory\n"
    )


def test_an_address_that_cannot_be_bound_is_one_line_and_exit_code_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = BindError("cannot listen on unix:/run/x.sock (/run/x.sock is there and is not a socket")
    assert main(make_program(error, []), KVSTORE_FLAGS) == 1
    assert capsys.readouterr().err == f"zerolayer kvstore: error: {error}\n"


def test_any_other_error_of_serve_is_raised() -> None:
    with pytest.raises(RuntimeError, match="^boom$"):
        main(make_program(RuntimeError("boom"), []), KVSTORE_FLAGS)


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_declares_its_program(layer: str) -> None:
    program = importlib.import_module(f"zerolayer.{layer}.__main__").PROGRAM
    assert program.layer == layer
    assert program.description.startswith(f"``python -m zerolayer.{layer} ")


def test_the_loader_alone_refuses_a_model_it_cannot_read_in_one_line(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerolayer.loader.__main__ import PROGRAM

    flags = ["--model", str(tmp_path / "nope"), "--address", f"unix:{tmp_path / 'l.sock'}"]
    assert main(PROGRAM, flags) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zerolayer loader: error: --model {tmp_path / 'nope'}: ")
    assert err.endswith(": not a directory\n") and err.count("\n") == 1
