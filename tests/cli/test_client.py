"""The Python client behind ``zerolayer generate``."""

from __future__ import annotations

import subprocess
import sys

from zerolayer.cli.client import build_request, printable


def test_printable_escapes_terminal_control_characters() -> None:
    assert printable("a\x06b\nc\td\x1b[31m\x7f") == "a\\x06b\nc\td\\x1b[31m\\x7f"
    assert printable("héllo 日本") == "héllo 日本"


def test_build_request_sets_only_given_optionals() -> None:
    request = build_request("hi", max_new_tokens=5, top_k=3)
    assert (request.prompt, request.max_new_tokens, request.top_k) == ("hi", 5, 3)
    assert not request.HasField("temperature") and not request.HasField("seed")


def test_generate_rejects_negative_numbers_before_calling() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "zerolayer", "generate", "hi", "--max-new-tokens", "-5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--max-new-tokens: must be >= 0, got -5" in proc.stderr
