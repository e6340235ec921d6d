"""``zerolayer convert-llama2c`` and ``make-dummy`` as a user meets their mistakes: one line
naming the argument at fault, exit code 2, no traceback (in process: no layer runs)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from zerolayer.cli.main import main

DATA = Path(__file__).resolve().parents[2] / "zerolayer/checkpoints/data/stories260K"
MODEL, TOKENIZER = DATA / "stories260K.bin", DATA / "tok512.bin"


def run(*argv: str) -> tuple[int, str, str]:
    """``zerolayer ARGV`` in process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_swapped_arguments_name_the_checkpoint_and_the_order(tmp_path: Path) -> None:
    code, out, err = run("convert-llama2c", str(TOKENIZER), str(MODEL), str(tmp_path / "o"))
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith(f"zerolayer convert-llama2c: error: checkpoint {TOKENIZER}: ")
    assert "non-positive size" in line
    assert line.endswith("the order is CHECKPOINT TOKENIZER OUT_DIR)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("which", ["checkpoint", "tokenizer"])
def test_a_missing_input_is_one_line(which: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    inputs = (missing, TOKENIZER) if which == "checkpoint" else (MODEL, missing)
    code, _, err = run("convert-llama2c", *map(str, inputs), str(tmp_path / "o"))
    assert code == 2
    assert err == (
        f"zerolayer convert-llama2c: error: {which} {missing}: No such file or directory\n"
    )


def test_an_output_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run("convert-llama2c", str(MODEL), str(TOKENIZER), str(blocker / "o"))
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"zerolayer convert-llama2c: error: out_dir {blocker / 'o'}: ")


def test_convert_llama2c_help_explains_each_argument() -> None:
    code, out, _ = run("convert-llama2c", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "checkpoint the llama2.c model file, e.g. stories15M.bin (first)" in text
    assert "tokenizer the llama2.c tokenizer file, e.g. tokenizer.bin (second)" in text
    assert "out_dir directory to write (missing or empty)" in text


def test_make_dummy_help_says_the_big_presets_give_empty_text() -> None:
    code, out, _ = run("make-dummy", "--help")
    assert code == 0
    assert "their text is (nearly) empty" in " ".join(out.split())


def test_an_output_directory_that_holds_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    out_dir = tmp_path / "model"
    out_dir.mkdir()
    (out_dir / "config.json").write_text("{}")
    code, out, err = run("convert-llama2c", str(MODEL), str(TOKENIZER), str(out_dir))
    assert (code, out) == (2, "")
    assert err == (
        f"zerolayer convert-llama2c: error: out_dir {out_dir}: exists and is not an empty "
        "directory\n"
    )
    assert [p.name for p in out_dir.iterdir()] == ["config.json"]
    assert (out_dir / "config.json").read_text() == "{}"


def test_make_dummy_writes_chatml_that_transformers_renders_as_chatml(tmp_path: Path) -> None:
    import transformers

    model_dir = tmp_path / "chat"
    code, out, err = run("make-dummy", str(model_dir), "--chat-template", "chatml")
    assert (code, out, err) == (0, f"wrote {model_dir}\n", "")
    assert (model_dir / "chat_template.jinja").stat().st_mode & 0o777 == 0o644
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    messages = [
        {"role": "system", "content": "You are a dummy."},
        {"role": "user", "content": "Hi!"},
        {"role": "tool", "content": "42"},
    ]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nYou are a dummy.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    )


def test_make_dummy_writes_no_chat_template_unless_asked(tmp_path: Path) -> None:
    assert run("make-dummy", str(tmp_path / "plain"))[0] == 0
    assert not (tmp_path / "plain" / "chat_template.jinja").exists()


def test_make_dummy_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    assert run("make-dummy", str(model_dir))[0] == 0
    weights = (model_dir / "model.safetensors").read_bytes()
    code, out, err = run("make-dummy", str(model_dir), "--seed", "1")
    assert (code, out) == (2, "")
    assert err == (
        f"zerolayer make-dummy: error: out_dir {model_dir}: exists and is not an empty directory\n"
    )
    assert (model_dir / "model.safetensors").read_bytes() == weights  # nothing overwritten
    code, _, err = run("make-dummy", str(model_dir / "model.safetensors"))  # a file
    assert code == 2 and err.endswith(": exists and is not an empty directory\n")
