"""The example clients (examples/node, examples/python) against the shared stack: same greedy answer
as a native Generate call, and their stream text equals their unary text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from e2e.stack import text_stub

from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "examples" / "node"
PROMPT = "Hi, zerolayer"
"""13 bytes plus BOS: shorter than one KV block (16), so no request ever reuses cached blocks."""
MAX_NEW_TOKENS = 12
CLIENT_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def stack(shared_stack):
    # NOTE: the shared stack's model has a chat template (the Node client chats when there is one)
    return shared_stack.stack


@pytest.fixture(scope="module")
def native(stack) -> pb.GenerateResponse:
    """The reference: the same greedy request through the generated Python stubs."""
    request = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=MAX_NEW_TOKENS)
    return text_stub(stack).Generate(request, timeout=60)


def run_client(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict:
    """Runs an example client and parses the one JSON line it prints."""
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0])


def assert_matches_native(record: dict, native: pb.GenerateResponse) -> None:
    assert record["text"] == native.text
    assert record["token_ids"] == list(native.token_ids)
    assert len(record["token_ids"]) == MAX_NEW_TOKENS
    assert record["finish_reason"] == "FINISH_REASON_LENGTH"
    usage = dict(record["usage"])
    # No pins asked for: their fields at their defaults, or absent (protobufjs' defaults: true
    # shows every field, Python's MessageToDict only those set)
    pins = [usage.pop(k, 0) for k in ("cache_write_prompt_tokens", "pinned_prompt_tokens")]
    assert pins == [0, 0] and usage.pop("pin_refusal", "") == ""
    assert usage == {
        "prompt_tokens": len(PROMPT) + 1,
        "completion_tokens": MAX_NEW_TOKENS,
        "cached_prompt_tokens": 0,
    }
    assert record["stream_text"] == record["text"]
    assert record["stream_token_ids"] == record["token_ids"]


@pytest.fixture(scope="module")
def node() -> str:
    """The node executable, with the example's packages installed (``npm ci`` on first use);
    skips (before any stack starts) only where Node.js is not installed."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the Node example needs Node.js >= 18)")
    npm = shutil.which("npm")
    if not (NODE_DIR / "node_modules").is_dir():
        if npm is None:
            pytest.skip("npm is not installed (needed once for the Node example's packages)")
        # As a user of the example would: install its pinned packages from package-lock.json.
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--prefix", str(NODE_DIR)],
            check=True,
            timeout=600,
            capture_output=True,
        )
    return node


def test_node_client_matches_native_generate(node: str, stack, native, tmp_path: Path) -> None:
    record = run_client(
        [node, str(NODE_DIR / "client.js"), PROMPT, stack.config.listen, str(MAX_NEW_TOKENS)],
        cwd=tmp_path,
    )
    assert_matches_native(record, native)
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=PROMPT)])
    request = pb.GenerateRequest(messages=chat, max_new_tokens=MAX_NEW_TOKENS)
    native_chat = text_stub(stack).Generate(request, timeout=60)
    assert record["chat"] == {
        "text": native_chat.text,
        "token_ids": list(native_chat.token_ids),
        "finish_reason": pb.FinishReason.Name(native_chat.finish_reason),
    }
    assert native_chat.usage.prompt_tokens == len(f"<s><|user|>{PROMPT}\n<|assistant|>") - 2


def isolated_python_env() -> dict[str, str]:
    """Environment for ``python -S``: this venv's third-party packages on PYTHONPATH, but not its
    ``.pth`` hooks, so the editable ``zerolayer`` install (its generated ``*_pb2``) is invisible
    and the client must compile the .proto itself."""
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_python_client_uses_only_the_protos(tmp_path: Path) -> None:
    probe = "import importlib.util; print(importlib.util.find_spec('zerolayer'))"
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        cwd=tmp_path,
        env=isolated_python_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "None", done.stderr


def test_python_client_without_grpcio_tools_says_how_to_get_it(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked" / "grpc_tools"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError(\"No module named 'grpc_tools'\")\n")
    env = isolated_python_env()
    env["PYTHONPATH"] = os.pathsep.join((str(blocked.parent), env["PYTHONPATH"]))
    client = ROOT / "examples" / "python" / "client.py"
    done = subprocess.run(
        [sys.executable, "-S", str(client), PROMPT, "127.0.0.1:1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "client.py: error: needs grpcio-tools to compile the .proto at run time: pip install "
        "grpcio-tools (in zerolayer's venv it comes with the test extra: .venv/bin/pip install "
        "-e '.[test]')\n"
    )


def test_python_client_matches_native_generate(stack, native, tmp_path: Path) -> None:
    client = ROOT / "examples" / "python" / "client.py"
    record = run_client(
        [sys.executable, "-S", str(client), PROMPT, stack.config.listen, str(MAX_NEW_TOKENS)],
        cwd=tmp_path,
        env=isolated_python_env(),
    )
    assert_matches_native(record, native)


def test_the_examples_readme_gives_the_triton_client_s_venv_command() -> None:
    from frontend.kserve.test_kserve import TRITON_CLIENT_REQUIREMENT

    readme = (ROOT / "examples" / "README.md").read_text()
    assert "python3 -m venv .venv-triton && .venv-triton/bin/pip install " in readme
    assert f"'{TRITON_CLIENT_REQUIREMENT}'" in readme
    assert ".venv-triton/bin/python examples/kserve/triton_client.py" in readme
