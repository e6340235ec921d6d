"""Tests for the layer-by-layer copy of a checkpoint into one device buffer, on a CPU target (the
same packing and chunking code the CUDA path runs with pinned staging buffers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model
from zerolayer.loader.device_copy import ALIGNMENT, GroupCopier, layer_of, plan_placement
from zerolayer.sharing.mapped_file import MappedFile

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    model_dir = write_dummy_model(tmp_path_factory.mktemp("m"), PRESETS["tiny"], seed=3)
    manifest = read_checkpoint(Path(model_dir))
    return manifest, [MappedFile(p) for p in manifest.files]


def test_layer_of_reads_llama_names() -> None:
    assert layer_of("model.layers.12.mlp.up_proj.weight") == 12
    assert layer_of("model.embed_tokens.weight") is None
    assert layer_of("lm_head.weight") is None


def test_placement_groups_layers_in_order_aligned_and_disjoint(checkpoint) -> None:  # noqa: ANN001
    manifest, _ = checkpoint
    num_layers = PRESETS["tiny"].num_hidden_layers
    placement = plan_placement(manifest.tensors, num_layers)
    assert len(placement.groups) == num_layers + 1
    assert all(layer_of(n) is None for n in placement.groups[0])
    for i, group in enumerate(placement.groups[1:]):
        assert group and all(layer_of(n) == i for n in group)
    sizes = {t.name: t.nbytes for t in manifest.tensors}
    spans = sorted((placement.offsets[n], placement.offsets[n] + sizes[n]) for n in sizes)
    assert all(start % ALIGNMENT == 0 for start, _ in spans)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] <= placement.size_bytes
    # Group order is offset order: layer i's bytes all come before layer i + 1's.
    firsts = [min(placement.offsets[n] for n in g) for g in placement.groups]
    assert firsts == sorted(firsts)


def test_placement_refuses_a_layer_beyond_the_config(checkpoint) -> None:  # noqa: ANN001
    manifest, _ = checkpoint
    with pytest.raises(ValueError, match="layer"):
        plan_placement(manifest.tensors, 1)


@pytest.mark.parametrize("staging_bytes", [256, 1000, 4096, 1 << 20])
def test_copy_puts_every_tensor_at_its_offset_and_reports_groups_in_order(
    checkpoint,  # noqa: ANN001
    staging_bytes: int,
) -> None:
    manifest, files = checkpoint
    num_layers = PRESETS["tiny"].num_hidden_layers
    placement = plan_placement(manifest.tensors, num_layers)
    target = torch.full((placement.size_bytes,), 0xAB, dtype=torch.uint8)
    done: list[int] = []
    GroupCopier(files, manifest.tensors, placement, target, staging_bytes).run(done.append)
    assert done == list(range(num_layers + 1))
    for spec in manifest.tensors:
        want = files[spec.file_index].tensor(
            torch.uint8, (spec.nbytes,), spec.offset_bytes, spec.nbytes
        )
        start = placement.offsets[spec.name]
        assert torch.equal(target[start : start + spec.nbytes], want), spec.name


def test_copy_refuses_a_too_small_target(checkpoint) -> None:  # noqa: ANN001
    manifest, files = checkpoint
    placement = plan_placement(manifest.tensors, PRESETS["tiny"].num_hidden_layers)
    with pytest.raises(ValueError, match="target"):
        GroupCopier(files, manifest.tensors, placement, torch.zeros(10, dtype=torch.uint8))


def test_copy_stops_at_a_file_truncated_under_it(tmp_path: Path) -> None:
    """In a child: were the copy to read the lost pages, it would die of SIGBUS."""
    model_dir = write_dummy_model(tmp_path / "m", PRESETS["tiny"], seed=3)
    script = textwrap.dedent(
        f"""
        import os, torch
        from pathlib import Path
        from zerolayer.checkpoints.checkpoint import read_checkpoint
        from zerolayer.loader.device_copy import GroupCopier, plan_placement
        from zerolayer.sharing.file_identity import WeightFileChanged
        from zerolayer.sharing.mapped_file import MappedFile
        manifest = read_checkpoint(Path({str(model_dir)!r}))
        files = [MappedFile(p) for p in manifest.files]
        placement = plan_placement(manifest.tensors, {PRESETS["tiny"].num_hidden_layers})
        target = torch.zeros(placement.size_bytes, dtype=torch.uint8)
        done = []
        def truncate_after_first(g):
            done.append(g)
            os.truncate(manifest.files[0], 0)
        try:
            GroupCopier(files, manifest.tensors, placement, target, 256).run(truncate_after_first)
        except WeightFileChanged as exc:
            print(done, exc)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith(f"[0] weight file {model_dir}/model.safetensors changed since")
