"""``zerolayer up``'s flags, derived from the declarations: each once, with its default in
``--help``, and each reaching ``StackConfig`` (no process is started here)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from common.setting_samples import pretend_two_gpus, value, words

from zerolayer.cli.main import _stack_config, build_parser
from zerolayer.common.setting import REQUIRED, AtMost, config_from_args
from zerolayer.common.settings import up_settings
from zerolayer.stack.config import StackConfig

PUBLIC_FLAGS = (
    "--model --listen --run-dir --kv-cache-bytes --block-size --max-num-seqs "
    "--max-num-batched-tokens --num-threads --no-prefix-caching --device --no-supervise "
    "--kv-unavailable-timeout-s --metrics-port-base --generate"
).split()
"""up's flags that outside scripts use: each keeps its name."""
ADDED_FLAGS = "--served-model-name --no-prefetch --attention-backend --default-max-new-tokens "
ADDED_FLAGS += "--metrics-host"


def up_help() -> str:
    """``zerolayer up --help``, with argparse's line breaks undone."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--help"])
    return " ".join(out.getvalue().split())


def up_flags() -> list[str]:
    [up] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parser = up.choices["up"]
    return [option for action in parser._actions for option in action.option_strings]


def test_up_offers_every_public_flag_and_the_added_ones_each_once() -> None:
    flags = up_flags()
    assert len(flags) == len(set(flags))
    assert set(PUBLIC_FLAGS) | set(ADDED_FLAGS.split()) <= set(flags)
    own = {"-h", "--help", "--generate", "--print-commands"}
    assert set(flags) == own | {f for s in up_settings() for f in (s.flag, *s.aliases)}


def test_up_help_lists_every_up_setting_with_its_default() -> None:
    text = up_help()
    for setting in up_settings():
        assert f" {setting.flag} " in text, setting.flag
        if setting.is_switch:
            continue
        shown = "" if setting.default in (None, "", REQUIRED) else f" {setting.default}"
        note = f": {setting.default_note}" if setting.default_note else ""
        assert f"default{shown}{note})" in text, setting.flag
    assert "(bytes; default 536870912: 512 MiB)" in text
    assert "--max-num-seqs N scheduler: most requests in the running set (default 64)" in text
    assert "--model DIR loader: Hugging Face model directory" in text
    assert "--schedulers N active schedulers" in text and "(at most 64; default 1)" in text
    assert "(s; at most 3600; default 3.0)" in text


def test_up_flags_reach_stack_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_two_gpus(monkeypatch)
    argv = [word for setting in up_settings() for word in words(setting)]
    args = build_parser().parse_args(["up", *argv])
    config = config_from_args(StackConfig, up_settings(), args)
    for setting in up_settings():
        assert getattr(config, setting.name) == value(setting), setting.flag
    assert config == StackConfig(**{s.name: value(s) for s in up_settings()})


def test_up_without_flags_is_the_default_stack_on_the_default_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import zerolayer.stack.preflight as preflight

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(preflight, "check_stack", lambda config: None)
    config = _stack_config(build_parser().parse_args(["up"]))
    assert config == StackConfig(model_dir=config.model_dir)
    assert Path(config.model_dir) == tmp_path / "cache/zerolayer/models/stories260K-v1"


def documented_up_flags() -> str:
    """docs/serving.md's "Flags of `up`" paragraph, with line breaks undone."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    start = text.index("Flags of `up`:")
    return " ".join(text[start : text.index("\n\n", start)].split())


def test_the_docs_name_every_up_flag_and_quote_its_declared_default() -> None:
    paragraph = documented_up_flags()
    for setting in up_settings():
        start = paragraph.index(f"`{setting.flag}")
        end = paragraph.find("`--", start + 1)
        said = re.search(r"\bdefault `?([^`,;) ]+)", paragraph[start:end])
        if said is None:
            continue
        word = said.group(1).rstrip(":")
        declared = {str(setting.default), setting.default_note.split(" ")[0]}
        if isinstance(setting.default, float):
            declared.add(f"{setting.default:g}")
        assert word in declared, (setting.flag, word)


def test_the_docs_state_the_bound_of_each_bounded_up_flag() -> None:
    paragraph = documented_up_flags()
    bounded = [setting for setting in up_settings() if isinstance(setting.check, AtMost)]
    assert {"--schedulers", "--standby-schedulers", "--frontends", "--owner-lease-s"} <= {
        setting.flag for setting in bounded
    }
    for setting in bounded:
        start = paragraph.index(f"`{setting.flag}")
        end = paragraph.find("`--", start + 1)
        assert f"at most {setting.check.maximum}," in paragraph[start:end], setting.flag


NOT_FROM_UP = {
    "remove_arena_on_exit": "up removes the arena itself once every layer is down",
    "owner_id": "each scheduler's default, its --address, is what up wants",
    "nvml_script": "test only (hidden)",
}
"""The layer settings ``zerolayer up`` neither offers nor sets, and why."""


def test_every_layer_setting_is_offered_by_up_or_set_by_it(tmp_path: Path) -> None:
    """A layer setting declared later is reachable from ``up`` (offered, or wired by the
    launcher), or this test names why not."""
    from zerolayer.common.settings import SETTINGS
    from zerolayer.stack.launcher import Stack

    stack = Stack(StackConfig(model_dir=str(tmp_path), run_dir=str(tmp_path / "run")))
    wired = set().union(*(stack.wiring(name) for name in stack.slots))
    for setting in SETTINGS:
        if setting.layers and not setting.up:
            assert setting.name in wired or setting.name in NOT_FROM_UP, setting.flag
    assert set(NOT_FROM_UP) <= {s.name for s in SETTINGS if s.layers and not s.up}
    offered = {s.flag for s in up_settings()}
    needed = "--metrics-host --served-model-name --attention-backend --default-max-new-tokens"
    assert set(needed.split()) <= offered


@pytest.mark.parametrize(
    ("text", "size"),
    [("536870912", 2**29), ("512M", 2**29), ("4G", 2**32), ("1T", 2**40), ("1.5GiB", 3 << 29)],
)
def test_kv_cache_bytes_takes_binary_size_units(text: str, size: int) -> None:
    assert build_parser().parse_args(["up", "--kv-cache-bytes", text]).kv_cache_bytes == size
    layer = build_parser().parse_args(["kvstore", "--kv-cache-bytes", text, *KVSTORE_WIRING])
    assert layer.kv_cache_bytes == size


KVSTORE_WIRING = ["--address", "unix:/a", "--loader", "unix:/b", "--shm-path", "/dev/shm/x"]


def usage_error(*argv: str) -> str:
    """stderr of ``zerolayer ARGV``, which must be a usage error (exit code 2)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        build_parser().parse_args(list(argv))
    assert info.value.code == 2
    return err.getvalue()


def test_a_bad_size_is_a_usage_error_that_says_what_a_size_is() -> None:
    err = usage_error("up", "--kv-cache-bytes", "1X")
    assert err.endswith(
        "zerolayer up: error: --kv-cache-bytes: invalid size '1X': a number of bytes, "
        "or with a binary unit K, M, G or T (also KiB ... TiB; 1K = 1024), e.g. 512M, 4G\n"
    )


@pytest.mark.parametrize("flag", ["--modle", "--mode"])
def test_a_mistyped_flag_of_up_is_up_s_error(flag: str) -> None:
    err = usage_error("up", flag, "x")
    assert err == f"zerolayer up: error: unrecognized arguments: {flag} x\n"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["up", "--kv-cache-bytes", "-5"], "zerolayer up: error: --kv-cache-bytes: invalid size"),
        (
            ["generate", "x", "--max-new-tokens", "-1"],
            "zerolayer generate: error: --max-new-tokens: must be in [0, 4294967295], got -1",
        ),
        (
            ["bench", "throughput", "--num-requests", "-1"],
            "zerolayer bench throughput: error: --num-requests: must be at least 1, got -1",
        ),
        (
            ["bench", "latency", "--rates", "1,x"],
            "zerolayer bench latency: error: --rates: 'x': could not convert string to float",
        ),
        (["bench"], "zerolayer bench: error: the following arguments are required: SCENARIO"),
        (
            ["make-dummy", "m", "--chat-template", "llama"],
            "zerolayer make-dummy: error: --chat-template: invalid choice: 'llama'",
        ),
        (["quantize", "in"], "zerolayer quantize: error: the following arguments are required"),
        (["loader", "--address"], "zerolayer loader: error: --address: expected one argument"),
        (["health", "--timeout", "soon"], "zerolayer health: error: --timeout: invalid"),
    ],
)
def test_a_refusal_is_one_line_without_the_usage_block(argv: list[str], line: str) -> None:
    err = usage_error(*argv)
    assert err.startswith(line) and err.count("\n") == 1, err


def test_zerolayer_version() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--version"])
    assert info.value.code == 0
    assert re.fullmatch(r"zerolayer \d+\.\d+\.\d+\S*\n", out.getvalue())


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("a\nb", "contains the control character '\\n' (none are allowed)"),
        ("x" * 257, "longer than 256 characters"),
    ],
)
def test_a_served_model_name_is_checked_as_a_request_id(name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"--served-model-name: {reason}")):
        StackConfig(model_dir="m", model_name=name)
    err = usage_error("loader", "--address", "unix:/a", "--model", "m", "--served-model-name", name)
    assert f"zerolayer loader: error: --served-model-name/--model-name: {reason}\n" == err


def test_print_commands_prints_what_up_runs_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerolayer.cli.main import main
    from zerolayer.stack.launcher import Stack

    run_dir = tmp_path / "run"
    flags = ["--model", str(tmp_path), "--run-dir", str(run_dir), "--metrics-port-base", "9100"]
    assert main(["up", "--print-commands", *flags, "--served-model-name", "m"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert not run_dir.exists()  # nothing made, nothing started
    config = StackConfig(
        model_dir=str(tmp_path), run_dir=str(run_dir), metrics_port_base=9100, model_name="m"
    )
    stack = Stack(config)
    expected = [
        line for name in stack.slots for line in (f"# {name}", shlex.join(stack.command(name)))
    ]
    assert out == expected
    scheduler = shlex.split(out[out.index("# scheduler") + 1])
    assert scheduler[1:3] == ["-m", "zerolayer.scheduler"]
    args = build_parser().parse_args(["scheduler", *scheduler[3:]])
    assert args.metrics_port == 9102 and args.address == f"unix:{run_dir}/scheduler.sock"


def test_the_earlier_model_name_flag_still_sets_the_served_name() -> None:
    # --model-name was the layers' flag before --served-model-name: scripts still pass it.
    for program in ("loader", "up"):
        parsers = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
        address = ["--address", "unix:/a"] if program != "up" else []
        args = parsers[program].parse_args(["--model", "m", "--model-name", "tiny", *address])
        assert args.model_name == "tiny"


def test_relative_paths_reach_the_layers_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The layers run in the package's directory: `up --model mymodel` from the user's own
    # directory once gave the loader a path it could not find there.
    from zerolayer.cli.main import main

    (tmp_path / "tenants.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    flags = ["--model", "mymodel", "--tenants", "tenants.json", "--run-dir", "run"]
    assert main(["up", "--print-commands", *flags]) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()[1::2]]
    loader = commands[0]
    assert loader[loader.index("--model") + 1] == str(tmp_path / "mymodel")
    frontend = next(c for c in commands if c[2] == "zerolayer.frontend")
    assert frontend[frontend.index("--tenants") + 1] == str(tmp_path / "tenants.json")


@pytest.mark.parametrize(
    ("argv", "field", "at"),
    [
        (["generate", "\udcff\udcfeOnce"], "prompt", 0),
        (["generate", "--message", "user=\udcff"], "--message", 5),
        (["tokenize", "a\udcff"], "text", 1),
        (["up", "--generate", "\udcff"], "--generate", 0),
    ],
)
def test_text_that_is_not_utf8_is_a_one_line_refusal(argv: list[str], field: str, at: int) -> None:
    # Undecodable argv bytes reach Python as lone surrogates (PEP 383); they once gave a
    # UnicodeEncodeError traceback (for up --generate, after the whole stack had started).
    err = usage_error(*argv)
    assert err == f"zerolayer {argv[0]}: error: {field}: not valid UTF-8 (at character {at})\n"


def test_an_unknown_or_missing_command_is_one_line() -> None:
    assert usage_error("nosuchcmd").startswith(
        "zerolayer: error: command: invalid choice: 'nosuchcmd' (choose from 'up', "
    )
    assert usage_error("nosuchcmd").count("\n") == 1
    assert usage_error() == "zerolayer: error: the following arguments are required: command\n"
