"""A small Python client of the public API (used by ``zerolayer generate``)."""

from __future__ import annotations

import argparse
import sys

import grpc

from zerolayer.v1 import generation_pb2, generation_pb2_grpc


def build_request(
    prompt: str,
    max_new_tokens: int = 0,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: list[str] | None = None,
) -> generation_pb2.GenerateRequest:
    """A GenerateRequest with only the given optional fields set."""
    request = generation_pb2.GenerateRequest(
        prompt=prompt, max_new_tokens=max_new_tokens, stop=stop or []
    )
    for name, value in (
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("seed", seed),
    ):
        if value is not None:
            setattr(request, name, value)
    return request


def generate_text(address: str, prompt: str, max_new_tokens: int = 0) -> str:
    """One unary Generate call; returns the generated text."""
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        response = stub.Generate(build_request(prompt, max_new_tokens), timeout=300)
    return response.text


_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if chr(c) not in "\n\t"} | {127: "\\x7f"}


def printable(text: str) -> str:
    """Text safe for a terminal: control characters (other than newline and tab) are shown as
    ``\\xNN`` escapes, so model output cannot send escape sequences to the terminal."""
    return text.translate(_CONTROL)


def rpc_error_line(command: str, exc: grpc.RpcError) -> str:
    """A failed call as one line for a terminal: ``zerolayer <command>: CODE: details``."""
    return f"zerolayer {command}: {exc.code().name}: {exc.details()}"


def run_generate(args: argparse.Namespace) -> int:
    """``zerolayer generate``: prints the text (streamed or whole); exit code 1 on a gRPC error,
    130 on Ctrl-C."""
    request = build_request(
        args.prompt,
        args.max_new_tokens,
        args.temperature,
        args.top_p,
        args.top_k,
        args.seed,
        args.stop,
    )
    try:
        with grpc.insecure_channel(args.address) as channel:
            stub = generation_pb2_grpc.TextGenerationStub(channel)
            if args.stream:
                for part in stub.GenerateStream(request, timeout=args.timeout):
                    sys.stdout.write(printable(part.text))
                    sys.stdout.flush()
                sys.stdout.write("\n")
            else:
                print(printable(stub.Generate(request, timeout=args.timeout).text))
    except grpc.RpcError as exc:
        print(rpc_error_line("generate", exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nzerolayer generate: cancelled", file=sys.stderr)
        return 130
    return 0
