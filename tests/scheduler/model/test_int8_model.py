"""The forward's weights of an int8 checkpoint: views of the loader's file mapping, not copies."""

from __future__ import annotations

from pathlib import Path

import torch

from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.quantize import quantize_checkpoint
from zerolayer.scheduler.model.int8_linear import Int8Weight
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.scheduler.model.weights import MappedWeights


def test_int8_projections_are_views_of_the_mapped_file(tmp_path: Path) -> None:
    quantize_checkpoint(ensure_dummy_model(cache_dir=tmp_path / "cache"), tmp_path / "int8")
    manifest = read_checkpoint(tmp_path / "int8")
    weights = MappedWeights(manifest)
    model = LlamaModel(ModelConfig.from_json(manifest.config_json), weights.tensors)
    matrices = [model.lm_head]
    for layer in model.layers:
        matrices += [*layer.qkv, layer.o_proj, *layer.gate_up, layer.down_proj]
    assert len(matrices) == 1 + 7 * len(model.layers)
    for matrix in matrices:
        assert isinstance(matrix, Int8Weight) and matrix.group_size == 32
        assert matrix.qweight.dtype == torch.int8 and matrix.scales.dtype == torch.float32
        assert all(weights.contains(t) for t in matrix.tensors())
    assert all(weights.contains(t) for layer in model.layers for t in layer.tensors())
