"""The ``zerolayer`` command as a user runs it: a real subprocess, real layers. Refusals made
before anything starts (argument and setting checks) run the same ``main`` in this process
(``in_process``): a fresh interpreter each would only repeat the start-up that the subprocess
tests here already check."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from e2e.stack import free_port
from factories import in_process

from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model

pytestmark = pytest.mark.e2e


def zerolayer(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "zerolayer", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def isolated_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


def leftovers(run_dir: str) -> list[str]:
    shm = f"/dev/shm/{Path(run_dir).name}.kv"
    return [p for p in (run_dir, shm) if os.path.exists(p)]


STORY = (  # greedy, the server's default 64 new tokens (llama2.c's expected run, continued)
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
    " a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said"
)


def test_up_generate_tells_a_story_with_the_default_model_and_cleans_up(tmp_path: Path) -> None:
    port = free_port()
    proc = zerolayer(
        "up",
        "--listen",
        f"127.0.0.1:{port}",
        "--generate",
        "Once upon a time",
        env=isolated_env(tmp_path),
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    match = re.search(
        r"^zerolayer: serving gRPC on 127\.0\.0\.1:(\d+); internal sockets in (\S+)$", err, re.M
    )
    assert match and int(match.group(1)) == port
    assert "serving the default model" in err and "stories260K" in err
    assert out == STORY + "\n"  # the answer alone: status lines go to stderr
    assert leftovers(match.group(2)) == []
    assert (tmp_path / "cache/zerolayer/models/stories260K-v1/model.safetensors").exists()


def test_the_readme_s_first_command_is_this_one_and_shows_its_story() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    first_command = readme.split("```bash\n", 1)[1].splitlines()[0]
    assert first_command.endswith('zerolayer up --generate "Once upon a time"')
    assert STORY in readme


def serving_run_dir(proc: subprocess.Popen) -> str:
    """Reads ``up``'s stderr up to its "serving" line; returns the run directory it names."""
    line = ""
    while "zerolayer: serving gRPC on" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, proc.stderr.read()
    return re.search(r"internal sockets in (\S+)$", line).group(1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])  # Ctrl-C; the terminal closed
def test_up_stops_every_layer_on_sigint(tmp_path: Path, sig: signal.Signals) -> None:
    proc = zerolayer("up", "--listen", f"127.0.0.1:{free_port()}", env=isolated_env(tmp_path))
    run_dir = serving_run_dir(proc)
    assert sorted(os.listdir(run_dir)) == ["kvstore.sock", "loader.sock", "scheduler.sock"]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    # The kvstore knows the stack ends: it does not claim to keep the arena that up removes.
    assert "kvstore INFO zerolayer.kvstore.kv_store: releasing the arena /dev/shm/" in err
    assert "keeping the arena" not in err
    assert leftovers(run_dir) == []
    children = subprocess.run(["pgrep", "-f", run_dir], capture_output=True, text=True).stdout
    assert children == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_start_up_stops_the_started_layers_at_once(
    sig: signal.Signals, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = zerolayer(
        "up",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--run-dir",
        str(run_dir),
        "--generate",
        "Hello",
        env=isolated_env(tmp_path),
    )
    line = ""
    while "listening on unix:" not in line:  # the first layer is up, the stack is not
        line = proc.stderr.readline()
        assert line or proc.poll() is None, proc.stdout.read()
    proc.send_signal(sig)
    interrupted = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - interrupted < 15, err
    assert proc.returncode == 128 + sig, err  # as a shell reports a process the signal killed
    assert "zerolayer up: interrupted during start-up" in err
    assert "serving gRPC on" not in err and out.strip() == ""  # --generate was not sent
    assert not list(run_dir.glob("*.sock"))
    children = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert children.stdout == ""


def test_convert_llama2c_command_writes_a_hf_directory(stories_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    proc = zerolayer(
        "convert-llama2c",
        str(stories_dir / "stories260K.bin"),
        str(stories_dir / "tok512.bin"),
        str(out),
    )
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 5


def test_generate_against_nothing_reports_unavailable() -> None:
    proc = zerolayer("generate", "hi", "--address", f"127.0.0.1:{free_port()}", "--timeout", "3")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "UNAVAILABLE" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-num-seqs", "0"], "--max-num-seqs: must be > 0"),
        (["--listen", "127.0.0.1:99999"], "--listen: '127.0.0.1:99999' is not HOST:PORT"),
        (["--block-size", "0"], "--block-size: must be a power of two (1, 2, 4, 8, 16 ...)"),
        (["--block-size", "7"], "--block-size: must be a power of two (1, 2, 4, 8, 16 ...)"),
        (["--block-size", "512"], "--block-size: must be at most 256"),
        (["--num-threads", "-3"], "--num-threads: must be >= 0"),
        (["--model", "/nonexistent"], "--model: /nonexistent: not a directory"),
        (["--device", "gpu"], "--device: 'gpu' is not one of cpu, auto, cuda, cuda:N"),
        (
            ["--kv-cache-bytes", "100"],
            # the default model: K and V x 5 layers x 16 tokens x 4 KV heads x 8 dims x 4 bytes
            "--kv-cache-bytes: 100 is smaller than one KV block of this model (20480 bytes: ",
        ),
        (
            ["--kv-cache-bytes", "99999999999999"],
            "--kv-cache-bytes: 99999999999999: the KV arena needs 99999999979520 bytes at "
            "/dev/shm, but only ",
        ),
        (["--run-dir", "/proc/foo"], "--run-dir: /proc/foo: cannot create it"),
        (["--schedulers", "1000000"], "--schedulers: must be at most 64"),
        (["--owner-lease-s", "1e12"], "--owner-lease-s: must be at most 3600"),
        (["--failover-wait-s", "inf"], "--failover-wait-s: must be a finite number > 0"),
        (
            ["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"],
            "--tls-cert: cannot read /nonexistent.pem: No such file or directory",
        ),
        (["--generate", "hi", "--tls-cert", "/c.pem"], "--generate: not with --tls-cert"),
        (["--generate", "hi", "--tenants", "/t.json"], "--generate: not with --tenants"),
    ],
)
def test_up_refuses_bad_settings_before_starting_anything(
    flags, message, tmp_path, monkeypatch, capfd
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    started = time.monotonic()
    returncode, err = in_process(capfd, "up", *flags)
    assert returncode == 2, err
    # the refusal last, and nothing of a stack before it (the default model's line included)
    assert err.rstrip().splitlines()[-1].startswith(f"zerolayer up: error: {message}")
    assert "serving the default model" not in err and "Traceback" not in err
    assert "zerolayer: stopping" not in err and "listening on" not in err  # no layer started
    assert time.monotonic() - started < 60


MODEL_REFUSALS = {
    # config.json field -> the line up prints (the tiny dummy: hidden 128, intermediate 256)
    "hidden_act": (
        {"hidden_act": "relu2"},
        "--model: config.json: hidden_act='relu2' is not supported (supported: silu, gelu, "
        "gelu_pytorch_tanh, relu)",
    ),
    "quantization_config": (
        {"quantization_config": {"quant_method": "awq"}},
        "--model: config.json: quantization_config={'quant_method': 'awq'} is not supported "
        '(supported: {"quant_method": "zerolayer_int8", "bits": 8, "group_size": G})',
    ),
    "shape": (
        {"intermediate_size": 512},
        "--model: checkpoint: tensor 'model.layers.0.mlp.down_proj.weight' has shape [128, 256], "
        "the config implies [128, 512]",
    ),
}


@pytest.mark.parametrize("case", sorted(MODEL_REFUSALS))
def test_up_refuses_a_model_it_cannot_serve_in_one_line(case: str, tmp_path: Path) -> None:
    """Config fields and checkpoint properties are refused by the pre-flight: one line, exit 2,
    no layer started (issue 15: a float32 norm or a bias must never crash or drift after start)."""
    fields, message = MODEL_REFUSALS[case]
    model_dir = write_dummy_model(tmp_path / "model", PRESETS["tiny"], seed=0)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, **fields}))
    proc = zerolayer("up", "--model", str(model_dir), env=isolated_env(tmp_path))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert err.rstrip().splitlines()[-1] == f"zerolayer up: error: {message}"
    assert "Traceback" not in err and "listening on" not in err


def test_up_refuses_a_run_dir_open_to_others_and_leaves_it_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "scheduler.sock").write_text("precious")
    listen = f"127.0.0.1:{free_port()}"
    proc = zerolayer("up", "--run-dir", str(shared), "--listen", listen, env=isolated_env(tmp_path))
    try:
        _, err = proc.communicate(timeout=120)
    finally:  # a stack that started anyway is stopped
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.rstrip().splitlines()[-1] == (
        f"zerolayer up: error: --run-dir: {shared}: mode 1777 lets other users in; give a new "
        "path (created with mode 0700) or a directory of mode 0700"
    )
    assert "Traceback" not in err and "listening on" not in err
    assert shared.stat().st_mode & 0o7777 == 0o1777
    assert (shared / "scheduler.sock").read_text() == "precious"


def test_up_warns_of_tenants_without_tls(tmp_path: Path) -> None:
    (tmp_path / "tenants.json").write_text('{"a": []}')
    flags = ["--tenants", str(tmp_path / "tenants.json"), "--schedulers", "1000000"]
    proc = zerolayer("up", *flags, env=isolated_env(tmp_path))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err  # refused after the warning: nothing starts
    [warning] = [line for line in err.splitlines() if "WARNING" in line]
    assert warning.endswith(
        "up WARNING: --tenants without --tls-cert: bearer tokens travel in plaintext, readable "
        "(and replayable) by anyone on the network path; give --tls-cert and --tls-key"
    )


@pytest.mark.parametrize("flag", ["--listen", "--metrics-port-base"])
def test_up_on_a_taken_port_fails_before_starting_anything(flag: str, tmp_path: Path) -> None:
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        flags = [flag, f"127.0.0.1:{port}" if flag == "--listen" else str(port)]
        proc = zerolayer("up", *flags, env=isolated_env(tmp_path))
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    where = f"127.0.0.1:{port}" if flag == "--listen" else f"port {port} (the loader's metrics) on"
    assert f"zerolayer up: error: {flag}: {where}" in err
    assert err.rstrip().endswith("the port is already in use")
    assert "Traceback" not in err and "listening on" not in err


def test_up_generate_with_an_empty_prompt_is_a_one_line_error(tmp_path: Path) -> None:
    proc = zerolayer(
        "up", "--listen", f"127.0.0.1:{free_port()}", "--generate", "", env=isolated_env(tmp_path)
    )
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err
    assert "zerolayer up: INVALID_ARGUMENT: prompt: empty" in err
    assert "Traceback" not in err and "_InactiveRpcError" not in err


def test_killing_up_takes_its_layers_down(tmp_path: Path, short_dir: Path) -> None:
    # NOTE: its run directory in a $TMPDIR of its own: an up starting meanwhile (a test on the
    # other worker) removes the run directories of dead ups it finds in its $TMPDIR
    env = {**isolated_env(tmp_path), "TMPDIR": str(short_dir)}
    proc = zerolayer("up", "--listen", f"127.0.0.1:{free_port()}", env=env)
    run_dir = serving_run_dir(proc)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = subprocess.run(["pgrep", "-f", run_dir], capture_output=True, text=True).stdout
        if not alive:
            break
        time.sleep(0.2)
    assert alive == ""
    # The orphaned kvstore removed the arena (nobody else would), the layers their sockets; the
    # run directory that up would have removed goes with the next up.
    assert not os.path.exists(f"/dev/shm/{Path(run_dir).name}.kv")
    assert os.listdir(run_dir) == []
    proc = zerolayer("up", "--print-commands", env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not os.path.exists(run_dir)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_up_on_a_gpu_the_machine_lacks_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    returncode, err = in_process(capfd, "up", "--device", "cuda:0")
    assert returncode == 2
    assert "'cuda:0' asked for, but this machine has no CUDA device" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("layer", ["loader", "kvstore", "scheduler"])
def test_a_layer_started_alone_on_a_missing_gpu_is_a_usage_error(
    layer: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    required = {
        "loader": ["--model", str(tmp_path)],
        "kvstore": ["--loader", "unix:/x", "--shm-path", str(tmp_path / "kv")],
        "scheduler": ["--loader", "unix:/x", "--kvstore", "unix:/y"],
    }[layer]
    returncode, err = in_process(
        capfd, layer, "--address", "unix:/z", *required, "--device", "cuda:3"
    )
    assert returncode == 2
    assert err.startswith(f"zerolayer {layer}: error: --device: ") and "cuda:3" in err


def test_stack_passes_one_resolved_device_to_loader_kvstore_and_scheduler(tmp_path: Path) -> None:
    from zerolayer.cli.main import build_parser
    from zerolayer.stack.launcher import Stack, StackConfig

    stack = Stack(StackConfig(model_dir=str(tmp_path), run_dir=str(tmp_path), device="auto"))
    want = "cuda:0" if torch.cuda.is_available() else "cpu"
    for layer in ("loader", "kvstore", "scheduler"):
        args = build_parser().parse_args([layer, *stack.command(layer)[3:]])
        assert args.device == want
    assert "--device" not in stack.command("frontend")


def test_preset_names_of_the_command_line_are_the_generators() -> None:
    from zerolayer.checkpoints.dummy import PRESETS
    from zerolayer.cli.presets import PRESET_NAMES

    assert list(PRESET_NAMES) == list(PRESETS)


def test_an_unknown_preset_is_a_usage_error(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    for args in (
        ["make-dummy", "--preset", "huge", str(tmp_path)],
        ["bench", "throughput", "--preset", "1B"],
    ):
        returncode, err = in_process(capfd, *args)
        assert returncode == 2 and "invalid choice" in err and "Traceback" not in err
