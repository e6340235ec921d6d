"""Text a JSON body can hold and Unicode cannot: a lone surrogate (``"\\ud800"``) is valid JSON
(RFC 8259 section 8.2 leaves it to the receiver) but no Unicode text, so nothing downstream (the
tokenizer, protobuf strings) can take it."""

from __future__ import annotations

from zerolayer.common.errors import InvalidArgument


def check_unicode(value: object) -> None:
    """Refuses a JSON value (as ``json.loads`` gives it) holding a string, or an object key,
    that is not Unicode text.

    Raises:
        InvalidArgument: the first such string, its field named as a path
            (``messages[0].content``).
    """
    pending: list[tuple[str, object]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            _check_text(path or "request body", item)
        elif isinstance(item, list):
            pending.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            for key, v in reversed(list(item.items())):
                _check_text(path or "request body", key)
                pending.append((f"{path}.{key}" if path else key, v))


def _check_text(field: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise InvalidArgument(
            field, f"not Unicode text: a lone surrogate \\u{ord(bad):04x} at {exc.start}"
        ) from None
