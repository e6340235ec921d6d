"""The ``zerolayer`` command: run the stack, one layer, a client call, or a checkpoint tool."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points, version
from types import ModuleType
from typing import TYPE_CHECKING

from zerolayer.cli import health, model_calls, tools
from zerolayer.cli.arg_types import positive, utf8_text
from zerolayer.cli.command_parser import CommandParser
from zerolayer.cli.generate_request import add_generate_arguments
from zerolayer.common.setting import add_arguments, config_from_args
from zerolayer.common.settings import LAYERS, layer_settings, up_settings

if TYPE_CHECKING:
    from zerolayer.stack.config import StackConfig


def _add_up(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start the four layers and serve until Ctrl-C")
    add_arguments(p, up_settings(), for_up=True)
    p.add_argument(
        "--print-commands",
        action="store_true",
        help="print the command line of each process up would run (to run or restart one layer "
        "by hand as up does; with --run-dir DIR, those of the stack on DIR) and exit",
    )
    p.add_argument(
        "--generate",
        metavar="TEXT",
        type=utf8_text,
        help="once healthy, send one Generate call with TEXT, print the answer and shut down",
    )


UINT32_MAX = 2**32 - 1
"""Largest value of a proto3 ``uint32`` field (``max_new_tokens``, ``top_k``)."""
UINT64_MAX = 2**64 - 1
"""Largest value of a proto3 ``uint64`` field (``seed``)."""
FLOAT32_MAX = 3.4028234663852886e38
"""Largest finite value of a proto3 ``float`` field (``temperature``, ``top_p``)."""


def _int_up_to(maximum: int) -> Callable[[str], int]:
    """An argparse type: an int in [0, ``maximum``] (a proto field's range)."""

    def parse(text: str) -> int:
        value = int(text)
        if not 0 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be in [0, {maximum}], got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its "invalid int value" message
    return parse


_uint32 = _int_up_to(UINT32_MAX)


def _float32(text: str) -> float:
    """An argparse type: a finite float a proto ``float`` field holds (no overflow to inf)."""
    value = float(text)
    if not abs(value) <= FLOAT32_MAX:
        raise argparse.ArgumentTypeError(f"must be finite and at most {FLOAT32_MAX:g}, got {text}")
    return value


_float32.__name__ = "float"  # argparse names the type in its "invalid float value" message


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="call Generate on a running zerolayer",
        description="Prints the generated text on stdout and, on stderr, why generation stopped "
        "and the token counts (--json: the whole response as JSON).",
    )
    add_generate_arguments(p, _uint32, _int_up_to, _float32)
    p.add_argument("--timeout", type=positive, default=300.0, help="deadline in seconds")
    model_calls.add_connection_arguments(p)


def _command_plugins() -> dict[str, ModuleType]:
    """Subcommands registered under the ``zerolayer.commands`` entry point group (e.g. ``bench``):
    modules with ``add_parser(subparsers)`` and ``run(args) -> int``."""
    return {ep.name: ep.load() for ep in entry_points(group="zerolayer.commands")}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``zerolayer`` command line.

    Args:
        command: the subcommand about to run. A command plugin (``bench``, whose scenarios
            import torch and transformers) is loaded whole only when it is that command; the
            others then show in ``--help`` by their ``HELP`` line alone, so ``zerolayer
            generate`` starts without importing torch. None: every plugin whole.
    """
    parser = CommandParser(prog="zerolayer", description=__doc__)
    parser.add_argument("--version", action="version", version=f"zerolayer {version('zerolayer')}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    _add_up(sub)
    _add_generate(sub)
    model_calls.add_parsers(sub)
    health.add_parser(sub)
    tools.add_parsers(sub)
    for name, plugin in _command_plugins().items():
        if command is None or command == name or not hasattr(plugin, "HELP"):
            plugin.add_parser(sub)
        else:
            sub.add_parser(name, help=plugin.HELP, add_help=False)
    for layer in LAYERS:
        add_arguments(
            sub.add_parser(layer, help=f"run the {layer} layer alone"), layer_settings(layer)
        )
    return parser


def _stack_config(args: argparse.Namespace, preflight: bool = True) -> StackConfig:
    """The stack's settings from ``up``'s flags (no ``--model``: the default model, stories260K),
    checked against this machine unless not ``preflight``.

    Raises:
        ValueError: a setting is out of range or cannot work here; the message starts with its
            flag.
    """
    from zerolayer.stack.config import StackConfig
    from zerolayer.stack.preflight import check_stack

    default_model = args.model_dir is None
    if default_model:
        # NOTE: imported here: it needs numpy, which up does not import before its layers start
        from zerolayer.checkpoints.default_model import ensure_default_model

        args = argparse.Namespace(**{**vars(args), "model_dir": str(ensure_default_model())})
    config = config_from_args(StackConfig, up_settings(), args)
    if preflight:
        check_stack(config)
    config = config.with_absolute_paths()  # NOTE: the layers run in the package's directory
    if default_model:  # NOTE: after the checks: a refusal is its one line alone
        print(
            f"zerolayer: no --model given, serving the default model {config.model_dir} "
            "(llama2.c's stories260K by Andrej Karpathy, MIT: tiny stories in simple English)",
            file=sys.stderr,
        )
    return config


def cmd_up(args: argparse.Namespace) -> int:
    """``zerolayer up``: start the stack, print the endpoint, serve until SIGINT/SIGTERM/SIGHUP.

    Exit codes: 0; 2 for a setting that is out of range or cannot work on this machine (checked
    before any process starts); 1 when a layer fails to start or the ``--generate`` call fails;
    128 + the signal's number (130 for SIGINT, 143 for SIGTERM, as a shell reports a process the
    signal killed) when SIGINT/SIGTERM arrives during start-up, whenever it arrives (the started
    layers are stopped); 0 when it stops a stack that serves.
    """
    from zerolayer.checkpoints.checkpoint import CheckpointError
    from zerolayer.cli.serving_line import serving_line
    from zerolayer.common.access import plaintext_tokens_warning
    from zerolayer.stack.launcher import Stack, StackError, StartupInterrupted

    logging.basicConfig(level="INFO", format="%(asctime)s up %(levelname)s: %(message)s")
    if args.print_commands:
        from zerolayer.cli.up_commands import print_commands

        try:
            # NOTE: no pre-flight: the stack may be running (its ports and run dir in use)
            return print_commands(_stack_config(args, preflight=False))
        except ValueError as exc:
            print(f"zerolayer up: error: {exc}", file=sys.stderr)
            return 2
    if args.generate is not None and (args.tls_cert or args.tenants):
        # NOTE: its call has no CA to verify the server with, nor a token to send
        flag, client_flag = (
            ("--tls-cert", "--tls-ca") if args.tls_cert else ("--tenants", "--token-file")
        )
        print(
            f"zerolayer up: error: --generate: not with {flag} (use zerolayer generate "
            f"{client_flag} ... once it serves)",
            file=sys.stderr,
        )
        return 2
    if (warning := plaintext_tokens_warning(args.tenants, args.tls_cert)) is not None:
        logging.getLogger(__name__).warning("%s", warning)
    received: list[int] = []  # the signals, in order; an interrupted start-up exits 128 + first
    stacks: list[Stack] = []
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()
        for stack in stacks:
            stack.interrupt()  # a start-up in progress ends at once

    # NOTE: before the checks, so that a signal at any time of start-up ends it the same way.
    # SIGHUP: the terminal closed; the layers are stopped in order as for Ctrl-C.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        config = _stack_config(args)
    except ValueError as exc:
        print(f"zerolayer up: error: {exc}", file=sys.stderr)
        return 2
    if stop.is_set():
        return _interrupted(received[0])
    try:
        stack = Stack(config)
    except StackError as exc:
        print(f"zerolayer up: error: {exc}", file=sys.stderr)
        return 1
    stacks.append(stack)
    if stop.is_set():  # a signal while it was made: start() starts nothing
        stack.interrupt()
    try:
        try:
            stack.start()
        except StartupInterrupted:
            return _interrupted(received[0])
        except (CheckpointError, StackError) as exc:
            print(f"zerolayer up: error: {exc}", file=sys.stderr)
            return 1
        if stop.is_set():
            return _interrupted(received[0])
        # NOTE: status on stderr: stdout carries only --generate's answer.
        print(serving_line(config, stack.run_dir), file=sys.stderr, flush=True)
        if args.generate is not None:
            return _generate_once(args.listen, args.generate)
        while not stop.wait(0.5):
            pass
        return 0
    finally:
        with contextlib.suppress(OSError):  # NOTE: after SIGHUP the terminal may be gone
            print("zerolayer: stopping", file=sys.stderr)
        stack.stop()


def _interrupted(signum: int) -> int:
    """Says that start-up was interrupted; returns the exit code for signal ``signum``."""
    print("zerolayer up: interrupted during start-up", file=sys.stderr)
    return 128 + signum


def _generate_once(address: str, prompt: str) -> int:
    """``up --generate``: prints the answer (0), or the call's error as one line (1)."""
    import grpc

    from zerolayer.cli.client import generate_text, printable, rpc_error_line

    try:
        print(printable(generate_text(address, prompt)), flush=True)
    except grpc.RpcError as exc:
        print(rpc_error_line("up", exc), file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zerolayer`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((word for word in argv if not word.startswith("-")), "")
    args = build_parser(command).parse_args(argv)
    if args.command == "up":
        return cmd_up(args)
    if args.command == "generate":
        from zerolayer.cli.client import run_generate

        return run_generate(args)
    if args.command == "tokenize":
        return model_calls.run_tokenize(args)
    if args.command == "info":
        return model_calls.run_info(args)
    if args.command == "health":
        return health.run_health(args)
    plugins = _command_plugins()
    if args.command in plugins:
        return plugins[args.command].run(args)
    if args.command == "convert-llama2c":
        return tools.run_convert_llama2c(args)
    if args.command == "make-dummy":
        return tools.run_make_dummy(args)
    if args.command == "quantize":
        return tools.run_quantize(args)
    from zerolayer.common.layer_main import run

    program = importlib.import_module(f"zerolayer.{args.command}.__main__").PROGRAM
    return run(program, args)


if __name__ == "__main__":
    sys.exit(main())
