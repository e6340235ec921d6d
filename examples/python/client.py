"""Calls zerolayer's public API with nothing but the published .proto files.

The gRPC code is generated in memory at run time (``grpc.protos_and_services``, which needs
grpcio-tools); no zerolayer package is imported. Sends one Generate and one GenerateStream with the
same greedy request and prints one JSON line::

    {"text", "token_ids", "finish_reason", "usage", "stream_text", "stream_token_ids"}

Usage::

    pip install grpcio grpcio-tools protobuf
    python client.py "Hello" [HOST:PORT] [MAX_NEW_TOKENS] [--proto-dir protos/]

In zerolayer's own virtual environment, grpcio-tools comes with the ``test`` extra
(``.venv/bin/pip install -e '.[test]'``); without it the client says so in one line (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import grpc

PROTO_DIR = Path(__file__).resolve().parents[2] / "protos"
"""The repository's protos/ directory (the published wire contract)."""

DEADLINE_S = 60.0
NO_GRPC_TOOLS = (
    "needs grpcio-tools to compile the .proto at run time: pip install grpcio-tools "
    "(in zerolayer's venv it comes with the test extra: .venv/bin/pip install -e '.[test]')"
)


def load_text_generation(proto_dir: Path) -> tuple[Any, Any]:
    """(messages module, services module) of zerolayer/v1/generation.proto, compiled at run time.

    Raises:
        FileNotFoundError: the .proto file is not under ``proto_dir``.
    """
    proto = "zerolayer/v1/generation.proto"
    if not (proto_dir / proto).is_file():
        raise FileNotFoundError(f"--proto-dir: {proto_dir / proto} does not exist")
    # NOTE: protos_and_services resolves the .proto path against sys.path.
    sys.path.insert(0, str(proto_dir))
    return grpc.protos_and_services(proto)


def usage_dict(usage: Any) -> dict[str, int]:
    """A Usage message as a plain dict (every field, zero values included)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_prompt_tokens": usage.cached_prompt_tokens,
    }


def run(address: str, prompt: str, max_new_tokens: int, proto_dir: Path) -> dict[str, Any]:
    """Calls Generate, then GenerateStream, with the same greedy request; returns the JSON record.

    Raises:
        grpc.RpcError: a call failed.
    """
    pb, services = load_text_generation(proto_dir)
    # temperature unset means greedy: the same request gives the same tokens every time.
    request = pb.GenerateRequest(prompt=prompt, max_new_tokens=max_new_tokens)
    with grpc.insecure_channel(address) as channel:
        stub = services.TextGenerationStub(channel)
        unary = stub.Generate(request, timeout=DEADLINE_S)
        stream_text, stream_ids = "", []
        for message in stub.GenerateStream(request, timeout=DEADLINE_S):
            stream_text += message.text
            stream_ids.extend(message.token_ids)
    return {
        "text": unary.text,
        "token_ids": list(unary.token_ids),
        "finish_reason": pb.FinishReason.Name(unary.finish_reason),
        "usage": usage_dict(unary.usage),
        "stream_text": stream_text,
        "stream_token_ids": stream_ids,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt")
    parser.add_argument("address", nargs="?", default="127.0.0.1:50051", help="HOST:PORT")
    parser.add_argument("max_new_tokens", nargs="?", type=int, default=16)
    parser.add_argument("--proto-dir", type=Path, default=PROTO_DIR, help="the protos/ directory")
    args = parser.parse_args(argv)
    try:
        record = run(args.address, args.prompt, args.max_new_tokens, args.proto_dir)
    except (FileNotFoundError, NotImplementedError) as exc:
        # NOTE: grpc raises NotImplementedError when grpcio-tools is not installed
        reason = NO_GRPC_TOOLS if isinstance(exc, NotImplementedError) else str(exc)
        print(f"client.py: error: {reason}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"zerolayer: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
