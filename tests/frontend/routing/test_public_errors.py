"""Public error messages: the failing layer named once, internal addresses and paths replaced."""

from __future__ import annotations

import pytest

from zerolayer.frontend.routing.public_errors import public_message, redacted


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("unix:/tmp/zerolayer-x1/scheduler.sock: down", "<internal>: down"),
        ("unix:///run/zl/kv.sock", "<internal>"),
        ("(unix-abstract:zerolayer.instance.a1b2)", "(<internal>)"),
        ("ipv4:10.0.0.2:50052: Connection refused", "<internal>: Connection refused"),
        ("ipv6:[::1]:50052: refused", "<internal>: refused"),
        ("cannot open '/run/zl/arena.kv'", "cannot open '<internal>'"),
        (
            "GPU fatal event: Xid 79 (GPU has fallen off the bus)",
            "GPU fatal event: Xid 79 (GPU has fallen off the bus)",
        ),
        ("12 tokens/s, 1/2 done", "12 tokens/s, 1/2 done"),
    ],
)
def test_redacted_replaces_every_internal_address_and_path_and_nothing_else(
    text: str, expected: str
) -> None:
    assert redacted(text) == expected


def test_public_message_names_the_layer_once() -> None:
    assert public_message("scheduler", "scheduler: the engine is still starting") == (
        "scheduler: the engine is still starting"
    )
    assert public_message("scheduler", "kvstore: down (unix:/tmp/z/kv.sock: gone)") == (
        "scheduler: kvstore: down (<internal>: gone)"
    )
