"""The parser of each ``zerolayer`` subcommand."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: a flag it does not know is its own usage error (argparse leaves
    unknown flags to the top-level parser, whose usage lists no subcommand's flags); a flag is
    spelled in full (no abbreviation such as ``--mode`` for ``--model``, which a flag added later
    could silently change); and a refusal is one line naming the flag, without the usage block
    (``zerolayer up: error: --kv-cache-bytes: ...``; ``--help`` shows the usage)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, but an unknown argument exits with this parser's usage error (code 2)."""
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        """Exits with code 2 after one line on stderr, ``PROG: error: MESSAGE``, where argparse's
        ``argument --flag: why`` reads ``--flag: why``, as the commands' own refusals do."""
        self.exit(2, f"{self.prog}: error: {message.removeprefix('argument ')}\n")
