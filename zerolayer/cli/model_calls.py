"""``zerolayer tokenize`` and ``zerolayer info``: the public API's Tokenize and GetModelInfo
calls on a running zerolayer, printed as text or (``--json``) as the whole response in JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from zerolayer.cli.arg_types import utf8_text
from zerolayer.cli.client import connect, printable, rpc_error_line
from zerolayer.common.settings import LISTEN
from zerolayer.v1 import generation_pb2, generation_pb2_grpc


def add_connection_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that reach the public API: ``--address``, TLS, bearer token, deadline."""
    p.add_argument(
        "--address", default=LISTEN.default, help=f"frontend HOST:PORT (default {LISTEN.default})"
    )
    p.add_argument(
        "--tls-ca", default="", metavar="PEM", help="connect with TLS, verifying the server by it"
    )
    p.add_argument(
        "--tls-cert", default="", metavar="PEM", help="client certificate (mTLS; with --tls-key)"
    )
    p.add_argument("--tls-key", default="", metavar="PEM", help="private key of --tls-cert")
    p.add_argument(
        "--token-file",
        default="",
        metavar="FILE",
        help="send the bearer token in FILE (a frontend with --tenants)",
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Adds ``tokenize`` and ``info`` to the ``zerolayer`` subcommands."""
    p = sub.add_parser("tokenize", help="call Tokenize on a running zerolayer")
    p.add_argument("text", type=utf8_text, help="text to tokenize")
    p.add_argument(
        "--add-special-tokens",
        action="store_true",
        help="add BOS as a text prompt of Generate gets it (default: the text's tokens only)",
    )
    p.add_argument("--json", action="store_true", help="print the whole response as JSON")
    add_connection_arguments(p)
    p = sub.add_parser("info", help="call GetModelInfo on a running zerolayer")
    p.add_argument("--json", action="store_true", help="print the whole response as JSON")
    add_connection_arguments(p)


def run_tokenize(args: argparse.Namespace) -> int:
    """``zerolayer tokenize``: the token ids on one line, then each id and its piece on a line of
    its own; exit code 1 on a gRPC error, 2 for a TLS or token flag that cannot work."""
    request = generation_pb2.TokenizeRequest(
        text=args.text, add_special_tokens=args.add_special_tokens
    )

    def show(response: generation_pb2.TokenizeResponse) -> str:
        ids = " ".join(map(str, response.token_ids))
        pairs = zip(response.token_ids, response.tokens, strict=True)
        pieces = (f"{token_id}\t{piece!r}" for token_id, piece in pairs)
        return "\n".join((ids, *pieces))

    return _call("tokenize", args, lambda stub, **kw: stub.Tokenize(request, **kw), show)


def run_info(args: argparse.Namespace) -> int:
    """``zerolayer info``: each field of the served model's ModelInfo as ``name: value``; exit
    codes as :func:`run_tokenize`."""

    def show(info: generation_pb2.ModelInfo) -> str:
        return "\n".join(f"{name}: {value}" for name, value in _fields(info).items())

    request = generation_pb2.GetModelInfoRequest()
    return _call("info", args, lambda stub, **kw: stub.GetModelInfo(request, **kw), show)


def _call(
    command: str,
    args: argparse.Namespace,
    call: Callable[..., Message],
    show: Callable[[Message], str],
) -> int:
    """Makes one call with the connection flags; prints ``show(response)``, or its JSON."""
    connection = connect(command, args)
    if connection is None:
        return 2
    channel, metadata = connection
    try:
        with channel:
            stub = generation_pb2_grpc.TextGenerationStub(channel)
            response = call(stub, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        print(rpc_error_line(command, exc), file=sys.stderr)
        return 1
    text = json.dumps(_fields(response), ensure_ascii=False) if args.json else show(response)
    print(printable(text))
    return 0


def _fields(message: Message) -> dict[str, object]:
    """Every field of ``message`` by its proto name, unset ones at their default (an unset
    ``optional`` field is left out); 64-bit integers stay numbers."""
    fields = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for field in message.DESCRIPTOR.fields:
        if field.name in fields and field.type in (field.TYPE_UINT64, field.TYPE_INT64):
            fields[field.name] = int(fields[field.name])
    return fields
