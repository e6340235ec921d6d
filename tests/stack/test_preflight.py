"""``zerolayer up``'s checks against this machine: real model files, real sockets, real statvfs."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.kv.arena_file import free_bytes
from zerolayer.stack.config import StackConfig
from zerolayer.stack.preflight import PreflightError, bind_error, check_stack


def make_preset() -> DummyPreset:
    return DummyPreset(32, 64, 2, 4, 2, 259, max_position_embeddings=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny float32 model: one KV block is 2 x 2 layers x 16 tokens x 2 heads x 8 dims x 4 B."""
    return write_dummy_model(tmp_path_factory.mktemp("model"), make_preset())


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other server listens on (with SO_REUSEADDR, as gRPC's do)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(model_dir: Path, **overrides: object) -> StackConfig:
    settings: dict = {"listen": f"127.0.0.1:{free_port()}", "kv_cache_bytes": 1 << 20}
    return StackConfig(model_dir=str(model_dir), **{**settings, **overrides})


def refusal(config: StackConfig, shm_dir: str = "/dev/shm") -> str:
    with pytest.raises(PreflightError) as info:
        check_stack(config, shm_dir)
    return str(info.value)


def test_settings_that_work_pass_and_create_the_run_dir(model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "a" / "run"
    check_stack(make_config(model_dir, run_dir=str(run_dir), metrics_port_base=free_port()))
    assert run_dir.is_dir()
    assert run_dir.stat().st_mode & 0o777 == 0o700


def test_a_taken_listen_port_is_refused(model_dir: Path, taken_port: int) -> None:
    for host in ("127.0.0.1", "localhost", "0.0.0.0"):
        config = make_config(model_dir, listen=f"{host}:{taken_port}")
        assert refusal(config) == f"--listen: {host}:{taken_port}: the port is already in use"


def test_a_taken_or_clashing_http_listen_port_is_refused(model_dir: Path, taken_port: int) -> None:
    config = make_config(model_dir, http_listen=f"127.0.0.1:{taken_port}")
    assert refusal(config) == f"--http-listen: 127.0.0.1:{taken_port}: the port is already in use"
    port = free_port()
    config = make_config(model_dir, listen=f"127.0.0.1:{port}", http_listen=f"127.0.0.1:{port}")
    assert refusal(config) == f"--http-listen: 127.0.0.1:{port}: the --listen port"


def test_a_taken_metrics_port_is_refused_naming_its_layer(model_dir: Path, taken_port: int) -> None:
    config = make_config(model_dir, metrics_port_base=taken_port - 2)
    assert refusal(config) == (
        f"--metrics-port-base: port {taken_port} (the scheduler's metrics) on 127.0.0.1: "
        "the port is already in use"
    )


def test_metrics_ports_overlapping_the_listen_port_are_refused(model_dir: Path) -> None:
    port = free_port()
    config = make_config(model_dir, listen=f"127.0.0.1:{port}", metrics_port_base=port - 3)
    assert refusal(config) == (
        f"--metrics-port-base: port {port} (the frontend's metrics) is the --listen port"
    )


def test_metrics_ports_overlapping_the_http_listen_port_are_refused(model_dir: Path) -> None:
    # free now, but the frontend's HTTP server and the scheduler's metrics would take it both
    port = free_port()
    config = make_config(model_dir, http_listen=f"127.0.0.1:{port}", metrics_port_base=port - 2)
    assert refusal(config) == (
        f"--metrics-port-base: port {port} (the scheduler's metrics) is the --http-listen port"
    )


def test_the_metrics_ports_of_extra_schedulers_and_frontends_are_checked(
    model_dir: Path, taken_port: int
) -> None:
    # loader N, kvstore N+1, scheduler N+2, frontend N+3, scheduler-1 N+4, frontend-1 N+5
    config = make_config(model_dir, metrics_port_base=taken_port - 5, schedulers=2, frontends=2)
    assert refusal(config) == (
        f"--metrics-port-base: port {taken_port} (the frontend-1's metrics) on 127.0.0.1: "
        "the port is already in use"
    )
    standby = make_config(model_dir, metrics_port_base=taken_port - 4, standby_schedulers=1)
    assert refusal(standby).startswith(f"--metrics-port-base: port {taken_port} (the scheduler-1's")


def test_bind_error_of_an_address_that_is_not_local() -> None:
    assert bind_error("192.0.2.1", free_port()) == (
        "cannot listen there (Cannot assign requested address)"
    )
    assert bind_error("127.0.0.1", free_port()) == ""


def test_kv_cache_bytes_below_one_block_is_refused(model_dir: Path) -> None:
    assert refusal(make_config(model_dir, kv_cache_bytes=4095)) == (
        "--kv-cache-bytes: 4095 is smaller than one KV block of this model (4096 bytes: K and V "
        "x 2 layers x 16 tokens x 2 KV heads x 8 dims x 4 bytes)"
    )


def test_kv_cache_bytes_below_the_blocks_of_the_schedulers_warm_up_is_refused(
    model_dir: Path,
) -> None:
    # warm-up: 32 prompt tokens + 2 new, less the last: 33 tokens of KV = 3 blocks of 16
    assert refusal(make_config(model_dir, kv_cache_bytes=3 * 4096 - 1)) == (
        "--kv-cache-bytes: 12287 holds 2 KV block(s) of this model; the scheduler's warm-up "
        "needs 3: at least 12288 bytes"
    )
    check_stack(make_config(model_dir, kv_cache_bytes=3 * 4096))


def test_an_arena_larger_than_the_free_space_is_refused(model_dir: Path, tmp_path: Path) -> None:
    message = refusal(make_config(model_dir, kv_cache_bytes=2**50 + 100), str(tmp_path))
    prefix = f"--kv-cache-bytes: {2**50 + 100}: the KV arena needs {2**50} bytes at {tmp_path}, "
    assert message.startswith(prefix + "but only ")
    free_said = int(message.removeprefix(prefix + "but only ").split()[0])
    assert abs(free_said - free_bytes(str(tmp_path))) < 2**30


def test_an_arena_in_device_memory_is_not_checked_against_the_shm_filesystem(
    model_dir: Path, tmp_path: Path
) -> None:
    config = make_config(model_dir, kv_cache_bytes=2**50)
    object.__setattr__(config, "device", "cuda:0")  # as resolved on a GPU machine
    check_stack(config, str(tmp_path))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("/nonexistent", "--model: /nonexistent: not a directory"),
        ("{tmp}", "--model: {tmp}: missing config.json"),
    ],
)
def test_a_model_that_cannot_be_read_is_refused(model: str, message: str, tmp_path: Path) -> None:
    config = make_config(Path(model.format(tmp=tmp_path)))
    assert refusal(config) == message.format(tmp=tmp_path)


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("tokenizer.json", "{bad", "tokenizer.json: not a valid tokenizer: Expecting property"),
        ("tokenizer.json", "{}", "tokenizer.json: not a valid tokenizer: "),
        ("tokenizer_config.json", "[]", "tokenizer_config.json: must be a JSON object"),
    ],
)
def test_a_broken_tokenizer_file_is_refused(
    model_dir: Path, tmp_path: Path, name: str, text: str, reason: str
) -> None:
    # The frontend once failed on it with a traceback after the other layers had started.
    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    (broken / name).write_text(text)
    assert refusal(make_config(broken)).startswith(f"--model: {reason}")


def test_a_run_dir_that_cannot_be_made_is_refused(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    for run_dir, reason in (
        ("/proc/foo", "cannot create it (No such file or directory)"),
        (str(tmp_path / "file"), "not a directory"),
        (str(tmp_path / ("d" * 100)), f"too long for a unix socket path ({tmp_path / ('d' * 100)}"),
    ):
        assert refusal(make_config(model_dir, run_dir=run_dir)).startswith(
            f"--run-dir: {run_dir}: {reason}"
        )


def test_the_sockets_of_every_scheduler_are_checked(model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(run_dir / "scheduler-2.sock"))
        server.listen()
        check_stack(make_config(model_dir, run_dir=str(run_dir), schedulers=2))
        assert refusal(make_config(model_dir, run_dir=str(run_dir), standby_schedulers=2)) == (
            f"--run-dir: {run_dir}: in use by a running stack "
            f"({run_dir / 'scheduler-2.sock'} accepts connections)"
        )
    # "scheduler-10.sock" is the longest path of 11 schedulers.
    name = "d" * (107 - len(f"{tmp_path}//scheduler-1.sock"))
    check_stack(make_config(model_dir, run_dir=str(tmp_path / name), schedulers=2))
    assert refusal(make_config(model_dir, run_dir=str(tmp_path / name), schedulers=11)) == (
        f"--run-dir: {tmp_path / name}: too long for a unix socket path "
        f"({tmp_path / name / 'scheduler-10.sock'} over 107 bytes)"
    )


def test_a_refused_start_leaves_no_run_dir(
    model_dir: Path, tmp_path: Path, taken_port: int
) -> None:
    config = make_config(model_dir, listen=f"127.0.0.1:{taken_port}", run_dir=str(tmp_path / "r"))
    refusal(config)
    assert list(tmp_path.iterdir()) == []


def test_a_relative_run_dir_is_the_one_under_the_current_directory_for_every_layer(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zerolayer.stack.launcher import Stack

    monkeypatch.chdir(tmp_path)
    config = make_config(model_dir, run_dir="rdx")
    assert config.run_dir == str(tmp_path / "rdx")
    check_stack(config)
    monkeypatch.chdir("/")  # the layers run elsewhere: their socket addresses must not move
    assert Stack(config).address("loader") == f"unix:{tmp_path / 'rdx' / 'loader.sock'}"


def test_a_run_dir_whose_sockets_are_live_is_refused(model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(run_dir / "kvstore.sock"))
        server.listen()
        assert refusal(make_config(model_dir, run_dir=str(run_dir))) == (
            f"--run-dir: {run_dir}: in use by a running stack "
            f"({run_dir / 'kvstore.sock'} accepts connections)"
        )
    check_stack(make_config(model_dir, run_dir=str(run_dir)))  # the stale file left is no user
    assert (run_dir / "kvstore.sock").exists()


def test_stacks_in_run_dirs_of_the_same_name_get_their_own_arena_and_instance_id(
    tmp_path: Path,
) -> None:
    from zerolayer.stack.launcher import Stack

    stacks = [
        Stack(StackConfig(model_dir=str(tmp_path), run_dir=str(tmp_path / side / "run")))
        for side in ("a", "b")
    ]
    assert stacks[0].shm_path != stacks[1].shm_path
    assert stacks[0].instance_id != stacks[1].instance_id
    for stack in stacks:
        assert stack.instance_id.startswith("run-")
        assert stack.shm_path == f"/dev/shm/{stack.instance_id}.kv"
        command = stack.command("frontend")
        assert command[command.index("--instance-id") + 1] == stack.instance_id
    temporary = Stack(StackConfig(model_dir=str(tmp_path)))
    try:
        assert temporary.instance_id == temporary.run_dir.name  # mkdtemp's name: unique already
    finally:
        temporary.stop()


@pytest.mark.parametrize("port", ["²", "١٢٣", "8080²"])
def test_a_listen_port_of_non_ascii_digits_is_refused_naming_the_flag(
    model_dir: Path, port: str
) -> None:
    with pytest.raises(ValueError, match="^--listen: ") as info:
        make_config(model_dir, listen=f"127.0.0.1:{port}")
    assert "in 1..65535" in str(info.value)


@pytest.mark.parametrize(
    ("listen", "reason"),
    [
        ("::1:52345", "an IPv6 address goes in brackets, [::1]:PORT"),
        ("[127.0.0.1]:52345", "brackets hold an IPv6 address"),
        ("[nonsense]:52345", "brackets hold an IPv6 address"),
        ("127.1:52345", "an IPv4 address needs four dotted numbers"),
        ("300.0.0.1:52345", "an IPv4 address needs four dotted numbers"),
    ],
)
def test_listen_hosts_grpc_cannot_bind_are_refused(
    model_dir: Path, listen: str, reason: str
) -> None:
    with pytest.raises(ValueError) as info:
        make_config(model_dir, listen=listen)
    assert str(info.value) == f"--listen: {listen!r}: {reason}"


@pytest.mark.parametrize("listen", ["[::1]:52345", "[::]:52345", "0.0.0.0:52345", "localhost:1"])
def test_bindable_listen_hosts_pass_the_host_check(model_dir: Path, listen: str) -> None:
    assert make_config(model_dir, listen=listen).listen == listen


def test_a_run_dir_whose_arena_path_another_user_took_is_refused(
    model_dir: Path, tmp_path: Path
) -> None:
    from zerolayer.stack.launcher import stack_instance_id

    run_dir, shm_dir = tmp_path / "run", tmp_path / "shm"
    shm_dir.mkdir()
    shm_path = shm_dir / f"{stack_instance_id(run_dir, owned=False)}.kv"
    config = make_config(model_dir, run_dir=str(run_dir))
    shm_path.write_bytes(b"")
    shm_path.chmod(0o600)  # an arena this user's stopped kvstore left: reopened or replaced
    check_stack(config, str(shm_dir))
    shm_path.chmod(0o666)
    assert refusal(config, str(shm_dir)) == (
        f"--run-dir: {run_dir}: its KV arena's path is taken: {shm_path} has mode 0666, open to "
        "other users (the stack makes its files 0600)"
    )
    shm_path.unlink()
    Path(f"{shm_path}.json").symlink_to(tmp_path / "victim")
    assert refusal(config, str(shm_dir)) == (
        f"--run-dir: {run_dir}: its KV arena's path is taken: {shm_path}.json is a symbolic link "
        "(not followed)"
    )


def test_a_run_dir_of_another_user_is_refused(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = tmp_path.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    assert refusal(make_config(model_dir, run_dir=str(tmp_path)), str(tmp_path)) == (
        f"--run-dir: {tmp_path}: owned by uid {owner}, not by this user (uid {owner + 1})"
    )


def test_tls_flags_are_checked_before_anything_starts(model_dir: Path, tmp_path: Path) -> None:
    assert refusal(make_config(model_dir, tls_client_ca="/ca.pem")) == (
        "--tls-client-ca: needs --tls-cert and --tls-key"
    )
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    config = make_config(model_dir, tls_cert=str(tmp_path / "cert.pem"), tls_key="/key.pem")
    assert refusal(config).startswith("--tls-cert: not PEM certificates (")


def test_the_tenants_file_is_checked_before_anything_starts(model_dir: Path) -> None:
    assert refusal(make_config(model_dir, tenants="/nonexistent.json")) == (
        "--tenants: cannot read /nonexistent.json: No such file or directory"
    )


@pytest.mark.parametrize("mode", [0o1777, 0o770, 0o755])
def test_a_run_dir_open_to_others_is_refused_and_left_as_it_is(
    model_dir: Path, tmp_path: Path, mode: int
) -> None:
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    run_dir.chmod(mode)
    (run_dir / "scheduler.sock").write_text("someone else's")
    assert refusal(make_config(model_dir, run_dir=str(run_dir))) == (
        f"--run-dir: {run_dir}: mode {mode:04o} lets other users in; give a new path (created "
        "with mode 0700) or a directory of mode 0700"
    )
    assert (run_dir.stat().st_mode & 0o7777, (run_dir / "scheduler.sock").read_text()) == (
        mode,
        "someone else's",
    )


def test_a_symlinked_run_dir_is_refused(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert refusal(make_config(model_dir, run_dir=str(tmp_path / "link"))) == (
        f"--run-dir: {tmp_path / 'link'}: is a symlink; give the directory itself"
    )


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_something_but_a_socket_at_a_socket_path_is_refused(
    model_dir: Path, tmp_path: Path, kind: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    path = run_dir / "kvstore.sock"
    {"file": path.write_text, "directory": lambda _: path.mkdir(), "symlink": path.symlink_to}[
        kind
    ](str(tmp_path / "elsewhere"))
    assert refusal(make_config(model_dir, run_dir=str(run_dir))) == (
        f"--run-dir: {path} is there and is not a socket: remove it yourself"
    )
    assert os.path.lexists(path)
