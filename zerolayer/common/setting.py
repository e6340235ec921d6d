"""One command-line setting, declared once (the declarations: ``zerolayer.common.settings``).

A :class:`Setting` holds everything the places that read a flag need: the layers' parsers and
``zerolayer up``'s (:meth:`Setting.add_to`), the launcher's command lines (:meth:`Setting.argv`)
and the checks of a value given in code (:meth:`Setting.validate`).
"""

from __future__ import annotations

import argparse
import decimal
import enum
import ipaddress
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")


class _Marker(enum.Enum):
    REQUIRED = "required"


REQUIRED = _Marker.REQUIRED
"""``Setting.default`` of a flag without a default: a layer that takes it must be given it."""


@dataclass(frozen=True)
class Setting:
    """A flag: its name in the configs, its text, its default and checks, and who takes it."""

    name: str
    """Field of the config dataclasses that hold it, and the argparse ``dest``."""
    flag: str
    """The command-line flag, e.g. ``--max-num-seqs``."""
    help: str
    """What it means, for ``--help``: one line, lower case, without the default."""
    default: Any = REQUIRED
    """Value when the flag is absent; :data:`REQUIRED`: its layers need it given."""
    parse: Callable[[str], Any] | None = None
    """Text to value, raising ValueError or argparse.ArgumentTypeError; None: the default's type
    (int, float, else str). A bool default makes a switch: the flag alone sets ``not default``."""
    check: Callable[[Any], None] | None = None
    """Raises ValueError with a reason (``must be > 0``) for a parsed value that cannot work."""
    unit: str = ""
    """Unit of the value (``bytes``, ``tokens``, ``s``), shown in ``--help``."""
    choices: tuple[str, ...] = ()
    """The values allowed; empty: any that parses."""
    metavar: str | None = None
    """Placeholder of the value in ``--help``; None: the flag's name in capitals."""
    layers: tuple[str, ...] = ()
    """The layers whose program takes the flag; empty: only ``zerolayer up`` does."""
    up: bool = False
    """``zerolayer up`` offers it (it is then a field of ``StackConfig``)."""
    hidden: bool = False
    """Left out of ``--help`` (test-only flags)."""
    default_note: str = ""
    """What the default means, when the value does not say (``one per available core``); for a
    required flag that ``up`` offers, what ``up`` does without it."""
    aliases: tuple[str, ...] = ()
    """Earlier spellings of the flag, still accepted (clients and scripts use them)."""
    multiple: bool = False
    """The value is a tuple of items: the flag may be repeated and each occurrence may be a
    comma-separated list (``--scheduler A --scheduler B,C``); :attr:`parse` and :attr:`check`
    apply to each item, and an item given twice is refused."""

    @property
    def is_switch(self) -> bool:
        """A flag without a value."""
        return isinstance(self.default, bool)

    @property
    def parser(self) -> Callable[[str], Any]:
        """Text to value: :attr:`parse`, or the default's type."""
        if self.parse is not None:
            return self.parse
        return type(self.default) if type(self.default) in (int, float) else str

    def validate(self, value: Any) -> None:
        """Checks a value given in code (e.g. a ``StackConfig`` field) by :attr:`choices` and
        :attr:`check`; each item of a :attr:`multiple` one (a lone string is one item).

        Raises:
            ValueError: the value cannot work; the message starts with the flag
                (``--max-num-seqs: must be > 0``).
        """
        try:
            for item in self.items(value) if self.multiple else (value,):
                if self.choices and item not in self.choices:
                    raise ValueError(f"{item!r} is not one of {', '.join(self.choices)}")
                if self.check is not None:
                    self.check(item)
        except ValueError as exc:
            raise ValueError(f"{self.flag}: {exc}") from None

    @staticmethod
    def items(value: Any) -> tuple[Any, ...]:
        """The items of a :attr:`multiple` setting's value: a lone string is one item."""
        return (value,) if isinstance(value, str) else tuple(value)

    def argv(self, value: Any) -> list[str]:
        """The command-line words that give ``value``: none for the default (or None); the flag
        once per item of a :attr:`multiple` setting's value (a lone string is one item)."""
        if value is None or (value == self.default and self.default is not REQUIRED):
            return []
        if self.multiple:
            return [word for item in self.items(value) for word in (self.flag, str(item))]
        return [self.flag] if self.is_switch else [self.flag, str(value)]

    def add_to(self, parser: argparse.ArgumentParser, for_up: bool = False) -> None:
        """Adds the flag to ``parser`` with ``dest=name``.

        Args:
            parser: a layer's parser, or ``zerolayer up``'s (``for_up``).
            for_up: up's flavour: the layers it goes to lead the help; the value is only parsed
                here and checked by ``StackConfig`` (so its error names the flag alone); a
                flag its layers require is optional (None when absent).
        """
        if self.is_switch:
            action = "store_false" if self.default else "store_true"
            parser.add_argument(
                self.flag, *self.aliases, dest=self.name, action=action, help=self.help_text(for_up)
            )
            return
        parse_one = self.parser if for_up else self._parse_and_check
        parser.add_argument(
            self.flag,
            *self.aliases,
            dest=self.name,
            type=partial(_parse_items, parse_one) if self.multiple else parse_one,
            action=_AddItems if self.multiple else "store",
            default=None if self.default is REQUIRED else self.default,
            required=self.default is REQUIRED and not for_up,
            choices=self.choices or None,
            metavar=self.metavar or self._flag_metavar(),
            help=self.help_text(for_up),
        )

    def help_text(self, for_up: bool = False) -> str:
        """The ``--help`` line: :meth:`description`, argparse's ``%`` escaped; hidden: none."""
        if self.hidden:
            return argparse.SUPPRESS
        return self.description(for_up).replace("%", "%%")

    def description(self, for_up: bool = False) -> str:
        """Help, unit, bound and default in one line; ``up``'s flavour (``for_up``) names the
        layers it goes to first."""
        text = f"{', '.join(self.layers)}: {self.help}" if for_up and self.layers else self.help
        details = [self.unit] if self.unit else []
        if isinstance(self.check, AtMost):
            details.append(f"at most {self.check.maximum}")
        if not self.is_switch and (self.default is not REQUIRED or for_up):
            default = self.default
            if self.multiple and default not in (None, REQUIRED):
                default = ",".join(map(str, default))
            shown = "" if default in (None, "", REQUIRED) else f" {default}"
            note = f": {self.default_note}" if self.default_note else ""
            details.append(f"default{shown}{note}")
        if details:
            text += f" ({'; '.join(details)})"
        return text

    def _flag_metavar(self) -> str | None:
        """argparse's placeholder for ``--flag`` (``FLAG``), or None: its ``{a,b}`` of choices."""
        return None if self.choices else self.flag.removeprefix("--").replace("-", "_").upper()

    def _parse_and_check(self, text: str) -> Any:
        """argparse ``type=`` of a layer's parser: :attr:`parser`, then :attr:`check`."""
        try:
            value = self.parser(text)
        except ValueError:  # as argparse words a failed ``type=int``
            raise argparse.ArgumentTypeError(
                f"invalid {self.parser.__name__} value: {text!r}"
            ) from None
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return value


class SettingError(ValueError):
    """A setting's value cannot work on this machine (a file it names is unreadable or not what
    it must be); found when a layer starts, or by ``zerolayer up``'s pre-flight check. The
    message starts with the flag (``--tls-cert: cannot read ...``)."""

    def __init__(self, setting: Setting, reason: str) -> None:
        super().__init__(f"{setting.flag}: {reason}")
        self.setting = setting
        """The setting at fault."""
        self.reason = reason
        """Why, without the flag."""


def _parse_items(parse_one: Callable[[str], Any], text: str) -> tuple[Any, ...]:
    """``type=`` of a :attr:`Setting.multiple` flag: a comma-separated list, each item parsed.

    Raises:
        argparse.ArgumentTypeError: an empty item, or one that does not parse.
    """
    words = [word.strip() for word in text.split(",")]
    if not all(words):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item")
    try:
        return tuple(parse_one(word) for word in words)
    except ValueError as exc:  # as argparse words a failed ``type=``
        raise argparse.ArgumentTypeError(f"invalid value in {text!r}: {exc}") from None


class _AddItems(argparse.Action):
    """``action=`` of a :attr:`Setting.multiple` flag: each occurrence adds its items to those of
    the earlier ones (the first replaces the default); an item given twice is an error."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = getattr(namespace, self.dest, None)
        items = () if items is None or items is self.default else tuple(items)
        for item in values:
            if item in items:
                raise argparse.ArgumentError(self, f"{item!r} given twice")
            items += (item,)
        setattr(namespace, self.dest, items)


def positive(value: float) -> None:
    """Check: a finite number > 0 (inf and nan are refused as not finite)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number > 0")
    if not value > 0:
        raise ValueError("must be > 0")


@dataclass(frozen=True)
class AtMost:
    """Check: :attr:`check` (e.g. :func:`positive`), then a value <= :attr:`maximum`; ``--help``
    shows the maximum (:meth:`Setting.help_text`)."""

    check: Callable[[Any], None]
    """The check of the value's lower end, run first."""
    maximum: int
    """The largest value allowed, in the setting's unit."""

    def __call__(self, value: Any) -> None:
        self.check(value)
        if value > self.maximum:
            raise ValueError(f"must be at most {self.maximum}")


BYTE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
"""Units of a byte count (:func:`parse_bytes`), binary: ``1K`` = 1024 bytes; ``KiB`` ... ``TiB``
(and ``KB`` ... ``TB``) are the same units, in any case."""
BYTE_COUNT = re.compile(r"(\d+(?:\.\d*)?)\s*(?:([KMGT])(?:i?B)?|B)?", re.ASCII | re.IGNORECASE)
"""A byte count as :func:`parse_bytes` reads it: the number, then the unit's letter."""


def parse_bytes(text: str) -> int:
    """A byte count: a number, optionally followed by a binary unit of :data:`BYTE_UNITS`
    (``536870912``, ``512M``, ``4G``, ``1.5GiB``, ``1T``); the result is rounded down to a
    whole byte.

    Raises:
        argparse.ArgumentTypeError: not a number with one of those units (the message says
            what is accepted).
    """
    match = BYTE_COUNT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: a number of bytes, or with a binary unit K, M, G or T "
            "(also KiB ... TiB; 1K = 1024), e.g. 512M, 4G"
        )
    number, unit = match.groups()
    return int(decimal.Decimal(number) * BYTE_UNITS[(unit or "").upper()])


MAX_NAME_CHARS = 256
"""Longest name :func:`printable_name` takes, characters (as a request's ``request_id``)."""


def printable_name(value: str) -> None:
    """Check: at most :data:`MAX_NAME_CHARS` characters and no control character (Unicode
    category Cc), as a request's ``request_id``: the name is echoed in responses, logs, traces
    and metric labels, where a newline or NUL could forge or cut a line."""
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"longer than {MAX_NAME_CHARS} characters")
    control = next((c for c in value if unicodedata.category(c) == "Cc"), None)
    if control is not None:
        raise ValueError(f"contains the control character {control!r} (none are allowed)")


def power_of_two(value: int) -> None:
    """Check: 1, 2, 4, 8 ... (a power of two)."""
    if value < 1 or value & (value - 1):
        raise ValueError("must be a power of two (1, 2, 4, 8, 16 ...)")


def non_negative(value: int) -> None:
    """Check: a number >= 0 (nan is refused)."""
    if not value >= 0:
        raise ValueError("must be >= 0")


def port_or_zero(value: int) -> None:
    """Check: a TCP port, or 0 (off)."""
    if not 0 <= value <= 65535:
        raise ValueError("must be in 1..65535 (or 0: off)")


def host_port(value: str) -> None:
    """Check: ``HOST:PORT`` that gRPC can bind, the port in 1..65535, an IPv6 host in brackets
    and an IPv4 one a full dotted quad (a resolver would take ``127.1``; gRPC does not)."""
    host, _, port = value.rpartition(":")
    # NOTE: str.isdigit also accepts digits int() refuses ("²"); ports are ASCII digits.
    if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT with a port in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{value!r}: brackets hold an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{value!r}: an IPv6 address goes in brackets, [{host}]:PORT")
    elif host.replace(".", "").isdigit():
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{value!r}: an IPv4 address needs four dotted numbers") from None


def host_port_or_empty(value: str) -> None:
    """Check: empty (off), or :func:`host_port`."""
    if value:
        host_port(value)


def add_arguments(
    parser: argparse.ArgumentParser, settings: Iterable[Setting], for_up: bool = False
) -> argparse.ArgumentParser:
    """Adds each setting's flag to ``parser`` (see :meth:`Setting.add_to`); returns ``parser``."""
    for setting in settings:
        setting.add_to(parser, for_up)
    return parser


def config_from_args(
    config_type: Callable[..., ConfigT], settings: Iterable[Setting], args: argparse.Namespace
) -> ConfigT:
    """The frozen config built from parsed flags: each setting's value goes to the field of its
    name (fields that are no setting keep their defaults).

    Raises:
        TypeError: ``config_type`` has no field for one of ``settings``.
    """
    return config_type(**{setting.name: getattr(args, setting.name) for setting in settings})


def command_line(settings: Iterable[Setting], values: Mapping[str, Any]) -> list[str]:
    """The flags that give a program taking ``settings`` the ``values`` (by setting name); a
    setting without a value, or at its default, is left out.

    Raises:
        KeyError: a required setting has no value.
    """
    argv: list[str] = []
    for setting in settings:
        if setting.name in values:
            argv += setting.argv(values[setting.name])
        elif setting.default is REQUIRED:
            raise KeyError(f"{setting.flag}: required, and no value given")
    return argv
