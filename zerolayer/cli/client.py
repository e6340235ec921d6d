"""A small Python client of the public API (used by ``zerolayer generate``)."""

from __future__ import annotations

import argparse
import ssl
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


class UsageError(Exception):
    """A flag of ``zerolayer generate`` that cannot work (a file that cannot be read or used, a
    flag without the one it needs); the message starts with the flag."""


def open_channel(
    address: str, tls_ca: str = "", tls_cert: str = "", tls_key: str = ""
) -> grpc.Channel:
    """A channel to the public API at ``address``: plaintext, or TLS when any PEM file is given.

    Args:
        tls_ca: PEM CA certificates to verify the server with ("" with another file given: the
            system's roots).
        tls_cert, tls_key: PEM client certificate and its unencrypted key, for a frontend that
            asks for one (``--tls-client-ca``); both or neither.

    Raises:
        UsageError: one of ``tls_cert`` and ``tls_key`` without the other, a file that cannot
            be read or holds no PEM certificates, or a key that does not match the certificate
            (checked with Python's ``ssl``, i.e. OpenSSL: gRPC's C core aborts the process on
            some of these).
    """
    if not (tls_ca or tls_cert or tls_key):
        return grpc.insecure_channel(address)
    if bool(tls_cert) != bool(tls_key):
        given, needed = ("--tls-cert", "--tls-key") if tls_cert else ("--tls-key", "--tls-cert")
        raise UsageError(f"{given}: needs {needed}")
    root_certificates = _read_certificates("--tls-ca", tls_ca) if tls_ca else None
    private_key = certificate_chain = None
    if tls_cert:
        certificate_chain = _read_certificates("--tls-cert", tls_cert)
        private_key = _read("--tls-key", tls_key)
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.load_cert_chain(tls_cert, tls_key, password=lambda: b"")
        except (ssl.SSLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or str(exc)
            raise UsageError(
                f"--tls-key: not an unencrypted PEM private key of --tls-cert ({reason})"
            ) from None
    credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
    return grpc.secure_channel(address, credentials)


def bearer_metadata(token_file: str) -> tuple[tuple[str, str], ...]:
    """The call metadata ``authorization: Bearer <token>`` of the token in ``token_file`` (its
    first line, without surrounding white space); none when ``token_file`` is "".

    Raises:
        UsageError: the file cannot be read, or its first line is empty or not visible ASCII
            characters (RFC 6750 tokens are; gRPC metadata could not carry others).
    """
    if not token_file:
        return ()
    token = _read("--token-file", token_file).split(b"\n", 1)[0].strip()
    if not token or not all(0x21 <= byte <= 0x7E for byte in token):
        raise UsageError(
            f"--token-file: {token_file}: the first line is not a token (visible ASCII characters)"
        )
    return (("authorization", f"Bearer {token.decode('ascii')}"),)


def _read(flag: str, path: str) -> bytes:
    """The bytes of the file ``path`` given to ``flag``; UsageError when it cannot be read."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc.strerror}") from None


def _read_certificates(flag: str, path: str) -> bytes:
    """The PEM certificates in the file ``path`` given to ``flag``; UsageError when it cannot be
    read or OpenSSL finds no certificates in it."""
    pem = _read(flag, path)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        raise UsageError(f"{flag}: {path}: not PEM certificates ({reason})") from None
    return pem


_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if chr(c) not in "\n\t"} | {127: "\\x7f"}


def printable(text: str) -> str:
    """Text safe for a terminal: control characters (other than newline and tab) are shown as
    ``\\xNN`` escapes, so model output cannot send escape sequences to the terminal."""
    return text.translate(_CONTROL)


def rpc_error_line(command: str, exc: grpc.RpcError) -> str:
    """A failed call as one line for a terminal: ``zerolayer <command>: CODE: details``."""
    return f"zerolayer {command}: {exc.code().name}: {exc.details()}"


def connect(
    command: str, args: argparse.Namespace
) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]] | None:
    """The channel and call metadata of ``zerolayer COMMAND``'s connection flags (``--address``,
    ``--tls-*``, ``--token-file``); None, with the one-line error printed on stderr, for a flag
    that cannot work (see :class:`UsageError`)."""
    try:
        metadata = bearer_metadata(args.token_file)
        return open_channel(args.address, args.tls_ca, args.tls_cert, args.tls_key), metadata
    except UsageError as exc:
        print(f"zerolayer {command}: error: {exc}", file=sys.stderr)
        return None


def run_generate(args: argparse.Namespace) -> int:
    """``zerolayer generate``: prints the text (streamed or whole) and, on stderr, why it stopped
    and the token counts (:mod:`zerolayer.cli.generate_output`); exit code 1 on a gRPC error, 2
    for a flag that cannot work (see :class:`UsageError`), 130 on Ctrl-C. A token sent in
    plaintext (no TLS flag) is warned of on stderr."""
    from zerolayer.cli.generate_output import print_response, print_stream
    from zerolayer.cli.generate_request import request_from_args

    try:
        request = request_from_args(args)
    except UsageError as exc:
        print(f"zerolayer generate: error: {exc}", file=sys.stderr)
        return 2
    connection = connect("generate", args)
    if connection is None:
        return 2
    channel, metadata = connection
    if metadata and not (args.tls_ca or args.tls_cert):
        print(
            "zerolayer generate: warning: --token-file without TLS: the bearer token travels "
            "in plaintext (give --tls-ca)",
            file=sys.stderr,
        )
    try:
        with channel:
            stub = generation_pb2_grpc.TextGenerationStub(channel)
            if args.stream:
                parts = stub.GenerateStream(request, timeout=args.timeout, metadata=metadata)
                try:
                    print_stream(parts, max(request.n, 1), args.json)
                except KeyboardInterrupt:
                    # NOTE: the call is cancelled before the channel closes (the server frees
                    # the request's blocks at once, and closing a channel with a call still
                    # running was seen to hang once).
                    parts.cancel()
                    raise
            else:
                response = stub.Generate(request, timeout=args.timeout, metadata=metadata)
                print_response(response, args.json)
    except grpc.RpcError as exc:
        print(rpc_error_line("generate", exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nzerolayer generate: cancelled", file=sys.stderr)
        return 130
    return 0
