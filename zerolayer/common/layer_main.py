"""The process edge every layer program shares: flags, config, logging, tracing, exit codes.

Each ``zerolayer/<layer>/__main__.py`` declares a :class:`LayerProgram` (its name, config type
and ``serve`` coroutine) and runs ``sys.exit(main(PROGRAM))``; ``zerolayer <layer> ...`` runs the
same program through :func:`run` with flags parsed by the ``zerolayer`` command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from zerolayer.common.server import BindError, exit_with_launcher, setup_logging
from zerolayer.common.setting import Setting, SettingError, add_arguments, config_from_args
from zerolayer.common.settings import layer_settings
from zerolayer.common.tracing import Tracing, TracingConfig


@dataclass(frozen=True)
class LayerProgram:
    """What is a layer's own at its process edge; :func:`run` does the rest."""

    layer: str
    """The layer's name ("loader", ...): its flags are the settings that name it."""
    config_type: Callable[..., Any]
    """Its frozen config dataclass, built from its parsed flags."""
    serve: Callable[[Any, Tracing], Coroutine[Any, Any, None]]
    """Serves with the config until SIGTERM."""
    description: str | None = None
    """The program's ``--help`` description (its module's docstring)."""
    setting_errors: tuple[tuple[type[Exception], Setting], ...] = ()
    """Exceptions of ``serve`` that mean a setting cannot work here, each with that setting:
    exit code 2 and one line ``zerolayer <layer>: error: --flag VALUE: reason`` (the exception's
    ``reason`` attribute, or its text) instead of a traceback."""


def build_parser(
    program: LayerProgram, parser: argparse.ArgumentParser | None = None
) -> argparse.ArgumentParser:
    """The layer's flags, on ``parser`` (a ``zerolayer`` subcommand) or a parser of its own."""
    parser = parser or argparse.ArgumentParser(
        prog=f"zerolayer {program.layer}", description=program.description
    )
    return add_arguments(parser, layer_settings(program.layer))


def main(program: LayerProgram, argv: Sequence[str] | None = None) -> int:
    """``python -m zerolayer.<layer>``: parses ``argv`` (default: ``sys.argv[1:]``) and runs the
    layer; returns the exit code (argparse exits with 2 on a bad flag)."""
    return run(program, build_parser(program).parse_args(argv))


def run(program: LayerProgram, args: argparse.Namespace) -> int:
    """Runs the layer with parsed flags until SIGTERM; returns the exit code: 0, or 2 for a
    :class:`SettingError` or one of ``program.setting_errors``, 1 for a :class:`BindError` (each
    printed as one line on stderr)."""
    exit_with_launcher(dict(os.environ))
    setup_logging(program.layer)
    config = config_from_args(program.config_type, layer_settings(program.layer), args)
    tracing = Tracing(TracingConfig.from_env(os.environ, program.layer))
    try:
        asyncio.run(program.serve(config, tracing))
    except BindError as exc:  # a taken port, a file at a socket path: not a bug of ours
        print(f"zerolayer {program.layer}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        setting = next((s for error, s in program.setting_errors if isinstance(exc, error)), None)
        if isinstance(exc, SettingError):
            setting = exc.setting
        if setting is None:
            raise
        reason = getattr(exc, "reason", "") or str(exc)
        value = getattr(config, setting.name)
        print(
            f"zerolayer {program.layer}: error: {setting.flag} {value}: {reason}", file=sys.stderr
        )
        return 2
    return 0
