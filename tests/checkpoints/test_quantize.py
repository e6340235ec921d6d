"""``zerolayer quantize`` and the int8 checkpoint format: the written tensors and scales, the
loader's acceptance of the result, and the refusals (one line, exit code 2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from cli.test_tools import run
from safetensors.torch import load_file

from zerolayer.checkpoints.checkpoint import CheckpointError, read_checkpoint
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.checkpoints.int8_format import (
    dequantize_weight,
    is_quantized_name,
    quantize_weight,
)
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.quantize import QuantizeError, quantize_checkpoint
from zerolayer.checkpoints.weight_check import check_weights

PRESET = DummyPreset(64, 96, 2, 4, 2, 259, 128, dtype="bfloat16")
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = write_dummy_model(tmp_path_factory.mktemp("src"), PRESET, seed=1)
    (model_dir / "chat_template.jinja").write_text("{{ messages }}")
    return model_dir


@pytest.fixture(scope="module")
def quantized(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("q") / "int8"
    quantize_checkpoint(source, out, group_size=32)
    return out


def test_projections_and_the_head_become_int8_with_one_scale_per_group(
    source: Path, quantized: Path
) -> None:
    before = load_file(source / "model.safetensors")
    after = load_file(quantized / "model.safetensors")
    quantized_names = sorted(name for name in before if is_quantized_name(name))
    assert len(quantized_names) == 2 * 7 + 1  # q k v o gate up down per layer, lm_head
    assert sorted(after) == sorted([*before, *(f"{n}_scale" for n in quantized_names)])
    for name in quantized_names:
        w, q, scales = before[name].float(), after[name], after[f"{name}_scale"]
        n, k = w.shape
        assert q.dtype == torch.int8 and q.shape == (n, k)
        assert scales.dtype == torch.float32 and scales.shape == (n, k // 32)
        groups = w.reshape(n, k // 32, 32)
        assert torch.equal(scales, groups.abs().amax(-1) / 127)
        assert q.abs().max() == 127  # each group's largest weight maps to +-127
        err = (dequantize_weight(q, scales) - w).abs().reshape(n, k // 32, 32)
        assert (err <= scales.unsqueeze(-1) * 0.501).all()  # half a step, up to float rounding
    for name in set(before) - set(quantized_names):  # embeddings and norms untouched
        assert torch.equal(after[name], before[name])


def test_config_and_side_files(source: Path, quantized: Path) -> None:
    config = json.loads((quantized / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "zerolayer_int8",
        "bits": 8,
        "group_size": 32,
    }
    assert {k: v for k, v in config.items() if k != "quantization_config"} == json.loads(
        (source / "config.json").read_text()
    )
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (quantized / name).read_bytes() == (source / name).read_bytes()
    assert (quantized / "chat_template.jinja").read_text() == "{{ messages }}"
    assert (quantized / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_the_loader_accepts_the_result_and_refuses_a_broken_one(quantized: Path) -> None:
    manifest = read_checkpoint(quantized)
    config = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
    assert config.int8_group_size == 32
    check_weights(manifest, config)
    scale = f"{Q_PROJ}_scale"
    missing = dataclasses.replace(
        manifest, tensors=tuple(t for t in manifest.tensors if t.name != scale)
    )
    with pytest.raises(CheckpointError, match=f"missing tensor '{scale}'"):
        check_weights(missing, config)
    as_bf16 = tuple(
        dataclasses.replace(t, dtype="BF16") if t.name == Q_PROJ else t for t in manifest.tensors
    )
    with pytest.raises(CheckpointError, match=f"'{Q_PROJ}' has dtype BF16, .* implies I8"):
        check_weights(dataclasses.replace(manifest, tensors=as_bf16), config)


def test_a_tied_model_gets_an_int8_head_from_its_embedding(source: Path, tmp_path: Path) -> None:
    tied = tmp_path / "tied"
    tied.mkdir()
    config = {**json.loads((source / "config.json").read_text()), "tie_word_embeddings": True}
    (tied / "config.json").write_text(json.dumps(config))
    (tied / "tokenizer.json").write_text((source / "tokenizer.json").read_text())
    tensors = load_file(source / "model.safetensors")
    del tensors["lm_head.weight"]
    from safetensors.torch import save_file

    save_file(tensors, str(tied / "model.safetensors"))
    quantize_checkpoint(tied, tmp_path / "out", 32)
    after = load_file(tmp_path / "out" / "model.safetensors")
    want = quantize_weight(tensors["model.embed_tokens.weight"], 32)
    assert torch.equal(after["lm_head.weight"], want[0])
    assert torch.equal(after["lm_head.weight_scale"], want[1])
    manifest = read_checkpoint(tmp_path / "out")
    check_weights(manifest, ModelConfig.from_json(manifest.config_json))


def test_cli_writes_the_checkpoint(source: Path, tmp_path: Path) -> None:
    code, out, err = run("quantize", str(source), str(tmp_path / "o"), "--group-size", "16")
    assert (code, out, err) == (0, f"wrote {tmp_path / 'o'}\n", "")
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["quantization_config"]["group_size"] == 16


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "{src}: not a directory"),
        ("quantized", "{src}: already quantized (quantization_config 'zerolayer_int8')"),
        (
            "group",
            "tensor 'lm_head.weight' of shape [259, 64]: K=64 is not a multiple of --group-size 48",
        ),
        ("dtype", f"tensor '{Q_PROJ}' has dtype torch.int32 (quantizable: F32, F16, BF16)"),
        ("not_empty", "{out}: exists and is not an empty directory"),
    ],
)
def test_refusals_are_one_line_and_exit_2(
    case: str, message: str, source: Path, quantized: Path, tmp_path: Path
) -> None:
    src, out, group_size = source, tmp_path / "out", "32"
    if case == "missing":
        src = tmp_path / "nowhere"
    elif case == "quantized":
        src = quantized
    elif case == "group":
        group_size = "48"
    elif case == "dtype":
        src = tmp_path / "ints"
        src.mkdir()
        (src / "config.json").write_text((source / "config.json").read_text())
        from safetensors.torch import save_file

        save_file({Q_PROJ: torch.ones(64, 64, dtype=torch.int32)}, str(src / "model.safetensors"))
    else:
        out.mkdir()
        (out / "x").write_text("")
    code, stdout, err = run("quantize", str(src), str(out), "--group-size", group_size)
    assert (code, stdout) == (2, "")
    assert err == f"zerolayer quantize: error: {message.format(src=src, out=out)}\n"
    if case != "not_empty":
        assert not out.exists()


def test_library_refuses_a_group_size_below_one(source: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="must be positive"):
        quantize_checkpoint(source, tmp_path / "o", group_size=0)


@pytest.mark.parametrize(
    "quantization",
    [
        {"quant_method": "awq", "bits": 8, "group_size": 32},
        {"quant_method": "zerolayer_int8", "bits": 4, "group_size": 32},
        {"quant_method": "zerolayer_int8", "bits": 8, "group_size": 0},
        {"quant_method": "zerolayer_int8", "bits": 8, "group_size": "32"},
        {"quant_method": "zerolayer_int8", "bits": 8},
        "zerolayer_int8",
    ],
)
def test_config_refuses_other_quantizations(source: Path, quantization: object) -> None:
    config = {**json.loads((source / "config.json").read_text())}
    config["quantization_config"] = quantization
    with pytest.raises(ValueError, match="quantization_config=.* is not supported"):
        ModelConfig.from_json(json.dumps(config))


@pytest.mark.parametrize("case", ["truncated", "config_list", "config_quantization_string"])
def test_broken_inputs_are_one_line_and_exit_2(case: str, source: Path, tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    config = json.loads((source / "config.json").read_text())
    weights = (source / "model.safetensors").read_bytes()
    if case == "truncated":
        weights = weights[:1000]
        expected = f"{src / 'model.safetensors'}: "
    elif case == "config_list":
        config = [1, 2]
        expected = f"{src}/config.json: not a JSON object"
    else:
        config["quantization_config"] = "gptq"
        expected = f"{src}: already quantized (quantization_config '?')"
    (src / "config.json").write_text(json.dumps(config))
    (src / "model.safetensors").write_bytes(weights)
    code, stdout, err = run("quantize", str(src), str(out))
    assert (code, stdout) == (2, "")
    assert err.startswith(f"zerolayer quantize: error: {expected}") and err.count("\n") == 1
    assert not out.exists()


def test_a_failed_write_leaves_nothing_behind(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    def fail(src: object, dst: object) -> None:
        raise KeyboardInterrupt  # as Ctrl-C (or SIGTERM's SystemExit) during the copy

    monkeypatch.setattr(shutil, "copyfile", fail)
    with pytest.raises(KeyboardInterrupt):
        quantize_checkpoint(source, tmp_path / "out", group_size=32)
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_quantize_leaves_nothing_behind(source: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    big = write_dummy_model(
        tmp_path / "big", DummyPreset(768, 2048, 8, 12, 4, 32000, 512, dtype="bfloat16"), seed=2
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zerolayer.cli.main", "quantize", str(big), str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    # NOTE: stopped as soon as it starts writing (anything new beside the source).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if [p for p in tmp_path.iterdir() if p.name != "big"]:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]  # once 0 in a parallel run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]
    assert "Traceback" not in err


def test_the_quantize_command_gives_the_callers_sigterm_handler_back(tmp_path: Path) -> None:
    import signal

    from zerolayer.cli.main import main as zerolayer_main

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        # Refused before any tensor is read: no such input.
        assert zerolayer_main(["quantize", str(tmp_path / "in"), str(tmp_path / "out")]) == 2
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
