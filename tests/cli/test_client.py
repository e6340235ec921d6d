"""The Python client behind ``zerolayer generate``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tls_certs import CertSet, make_test_certs

from zerolayer.cli.client import build_request, printable
from zerolayer.cli.main import main as zerolayer_main


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
    assert "--max-new-tokens: must be in [0, 4294967295], got -5" in proc.stderr


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-new-tokens", "99999999999", "must be in [0, 4294967295], got 99999999999"),
        ("--max-new-tokens", "4294967296", "must be in [0, 4294967295], got 4294967296"),
        ("--top-k", "4294967296", "must be in [0, 4294967295], got 4294967296"),
        ("--seed", "18446744073709551616", "must be in [0, 18446744073709551615], got 1844"),
        ("--seed", "-1", "must be in [0, 18446744073709551615], got -1"),
        ("--temperature", "1e39", "must be finite and at most 3.40282e+38, got 1e39"),
        ("--temperature", "nan", "must be finite and at most 3.40282e+38, got nan"),
        ("--top-p", "-inf", "must be finite and at most 3.40282e+38, got -inf"),
        ("--timeout", "inf", "must be > 0 and finite, got inf"),
        ("--max-new-tokens", "1.5", "invalid int value: '1.5'"),
    ],
)
def test_generate_numeric_flags_are_range_checked(flag, value, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        zerolayer_main(["generate", "hi", "--address", "127.0.0.1:1", f"{flag}={value}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zerolayer generate: error: {flag}: {message}") and err.count("\n") == 1


def test_generate_in_range_extremes_build_a_request() -> None:
    request = build_request("hi", 2**32 - 1, 3.4028234663852886e38, None, 2**32 - 1, 2**64 - 1)
    assert (request.max_new_tokens, request.top_k, request.seed) == (
        2**32 - 1,
        2**32 - 1,
        2**64 - 1,
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


def test_a_client_certificate_without_its_key_is_a_usage_error(certs: CertSet) -> None:
    # NOTE: a subprocess: gRPC's C core aborted the process on this
    for given, missing in (("--tls-cert", "--tls-key"), ("--tls-key", "--tls-cert")):
        path = certs.tenant_a.cert if given == "--tls-cert" else certs.tenant_a.key
        proc = subprocess.run(
            [sys.executable, "-m", "zerolayer", "generate", "hi", "--address", "127.0.0.1:1"]
            + ["--timeout", "1", given, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (proc.returncode, proc.stderr) == (
            2,
            f"zerolayer generate: error: {given}: needs {missing}\n",
        )


def bad_files(certs: CertSet, tmp: Path) -> list[tuple[list[str], str]]:
    """(flags, the error line's text after ``error: ``) for each file that cannot work."""
    (tmp / "garbage").write_text("not a certificate\n")
    (tmp / "bad-token").write_bytes(b"\xff\xfe\n")
    (tmp / "empty-token").write_text("\n")
    missing, garbage = str(tmp / "missing"), str(tmp / "garbage")
    cert, key, other_key = (
        str(certs.tenant_a.cert),
        str(certs.tenant_a.key),
        str(certs.tenant_b.key),
    )
    no_file = "No such file or directory"
    return [
        (["--tls-ca", missing], f"--tls-ca: cannot read {missing}: {no_file}"),
        (["--tls-ca", str(tmp)], f"--tls-ca: cannot read {tmp}: Is a directory"),
        (["--tls-ca", garbage], f"--tls-ca: {garbage}: not PEM certificates"),
        (
            ["--tls-cert", missing, "--tls-key", key],
            f"--tls-cert: cannot read {missing}: {no_file}",
        ),
        (["--tls-cert", garbage, "--tls-key", key], f"--tls-cert: {garbage}: not PEM certificates"),
        (
            ["--tls-cert", cert, "--tls-key", missing],
            f"--tls-key: cannot read {missing}: {no_file}",
        ),
        (["--tls-cert", cert, "--tls-key", other_key], "--tls-key: not an unencrypted PEM private"),
        (["--tls-cert", cert, "--tls-key", garbage], "--tls-key: not an unencrypted PEM private"),
        (["--token-file", missing], f"--token-file: cannot read {missing}: {no_file}"),
        (["--token-file", str(tmp / "bad-token")], "--token-file: " + str(tmp / "bad-token")),
        (["--token-file", str(tmp / "empty-token")], "--token-file: " + str(tmp / "empty-token")),
    ]


def test_tls_and_token_files_that_cannot_work_are_one_line_usage_errors(
    certs: CertSet, tmp_path: Path, capsys
) -> None:
    for flags, message in bad_files(certs, tmp_path):
        argv = ["generate", "hi", "--address", "127.0.0.1:1", "--timeout", "1", *flags]
        assert zerolayer_main(argv) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith(f"zerolayer generate: error: {message}"), (flags, err)
        assert err.count("\n") == 1, err


def test_a_token_sent_in_plaintext_is_warned_of(tmp_path: Path, capsys) -> None:
    (tmp_path / "token").write_text("secret\n")
    argv = ["generate", "hi", "--address", "127.0.0.1:1", "--timeout", "1"]
    assert zerolayer_main([*argv, "--token-file", str(tmp_path / "token")]) == 1
    warning, error = capsys.readouterr().err.splitlines()
    assert warning == (
        "zerolayer generate: warning: --token-file without TLS: the bearer token travels in "
        "plaintext (give --tls-ca)"
    )
    assert error.startswith("zerolayer generate: UNAVAILABLE")
    assert zerolayer_main(argv) == 1
    assert "warning" not in capsys.readouterr().err


def test_the_client_commands_do_not_import_torch() -> None:
    # Importing torch costs 2 s idle and up to 9 s under load: every `zerolayer generate` paid it
    # while the server answered in milliseconds.
    script = """
import sys
from zerolayer.cli.main import main
nowhere = ["--address", "127.0.0.1:1"]
quantize = ["quantize", "/nowhere/in", "/nowhere/out"]  # refused before any tensor is read
for argv in (
    ["generate", "hi", "--timeout", "0.5", *nowhere], ["info", *nowhere], ["--help"], quantize,
    ["health", "--timeout", "0.5", *nowhere],
):
    try:
        main(argv)
    except SystemExit:
        pass
print(sorted(m for m in ("torch", "transformers", "llguidance") if m in sys.modules))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr[-2000:]
