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


def open_channel(
    address: str, tls_ca: str = "", tls_cert: str = "", tls_key: str = ""
) -> grpc.Channel:
    """A channel to the public API at ``address``: plaintext, or TLS when any PEM file is given.

    Args:
        tls_ca: PEM CA certificates to verify the server with ("" with another file given: the
            system's roots).
        tls_cert, tls_key: PEM client certificate and key, for a frontend that asks for one
            (``--tls-client-ca``).

    Raises:
        OSError: a file cannot be read.
    """
    if not (tls_ca or tls_cert or tls_key):
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_optional(tls_ca),
        private_key=_read_optional(tls_key),
        certificate_chain=_read_optional(tls_cert),
    )
    return grpc.secure_channel(address, credentials)


def bearer_metadata(token_file: str) -> tuple[tuple[str, str], ...]:
    """The call metadata ``authorization: Bearer <token>`` of the token in ``token_file`` (its
    first line, without surrounding white space); none when ``token_file`` is "".

    Raises:
        OSError: the file cannot be read.
    """
    if not token_file:
        return ()
    with open(token_file, encoding="utf-8") as file:
        return (("authorization", f"Bearer {file.readline().strip()}"),)


def _read_optional(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as file:
        return file.read()


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
    2 when a TLS or token file cannot be read, 130 on Ctrl-C."""
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
        channel = open_channel(args.address, args.tls_ca, args.tls_cert, args.tls_key)
        metadata = bearer_metadata(args.token_file)
    except OSError as exc:
        print(f"zerolayer generate: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        with channel:
            stub = generation_pb2_grpc.TextGenerationStub(channel)
            if args.stream:
                for part in stub.GenerateStream(request, timeout=args.timeout, metadata=metadata):
                    sys.stdout.write(printable(part.text))
                    sys.stdout.flush()
                sys.stdout.write("\n")
            else:
                print(
                    printable(stub.Generate(request, timeout=args.timeout, metadata=metadata).text)
                )
    except grpc.RpcError as exc:
        print(rpc_error_line("generate", exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nzerolayer generate: cancelled", file=sys.stderr)
        return 130
    return 0
