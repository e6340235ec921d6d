"""argparse types of number flags: a value out of range is refused at the command line, in one
line naming the flag (``zerolayer bench throughput: error: --num-requests: must be at least 1, got
-1``), before anything starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its "invalid int value" message
    return parse


def positive(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be > 0 and finite, got {value}")
    return value


def comma_separated(item: Callable[[str], object], empty_ok: bool = False) -> Callable[[str], str]:
    """An argparse type: comma-separated values each of which ``item`` accepts (at least one
    unless ``empty_ok``); the text is kept as given (the scenario splits it)."""

    def parse(text: str) -> str:
        items = [part for part in text.split(",") if part] if text else []
        if not items and not empty_ok:
            raise argparse.ArgumentTypeError("must name at least one value")
        for part in items:
            try:
                item(part)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise argparse.ArgumentTypeError(f"{part!r}: {exc}") from None
        return text

    parse.__name__ = "list"
    return parse


def utf8_text(text: str) -> str:
    """Text as given on the command line, refused unless it is valid UTF-8 (the API's strings
    are; Python hands undecodable argv bytes over as lone surrogates, PEP 383)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 (at character {exc.start})") from None
    return text
