"""Tests for MappedFile and MappedWeights: zero-copy views, range checks, and one copy in RAM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.checkpoints.checkpoint import read_checkpoint, read_safetensors_header
from zerolayer.scheduler.model.weights import MappedWeights
from zerolayer.sharing.file_identity import UPDATE_ADVICE, WeightFileChanged
from zerolayer.sharing.manifest import HandleKind, WeightManifest
from zerolayer.sharing.mapped_file import PAGE_SIZE, MappedFile

REPO_ROOT = Path(__file__).resolve().parents[2]
BIG_TENSOR_NUMEL = 4 * 1024 * 1024  # 16 MiB of F32; four of them make the ~64 MiB file
TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 259,
}


def make_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.f32": torch.randn(7, 3, generator=g),
        "b.bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "c.f16": torch.randn(2, 2, 3, generator=g).to(torch.float16),
        "d.i64": torch.arange(4, dtype=torch.int64),
    }


def make_safetensors(path: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    save_file(tensors if tensors is not None else make_tensors(), path)
    return path


def make_model_dir(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    write_byte_level_tokenizer(path, 2048)
    save_file(tensors, path / "model.safetensors")
    return path


def make_mapped_weights(tmp_path: Path) -> tuple[MappedWeights, WeightManifest]:
    manifest = read_checkpoint(make_model_dir(tmp_path / "model", make_tensors()))
    return MappedWeights(manifest), manifest


def offsets_of(path: Path) -> dict[str, tuple[int, int]]:
    """(absolute offset, nbytes) of each tensor, from the safetensors header."""
    header, data_start = read_safetensors_header(path)
    return {
        name: (data_start + e["data_offsets"][0], e["data_offsets"][1] - e["data_offsets"][0])
        for name, e in header.items()
    }


def inside(mapped: MappedFile, tensor: torch.Tensor) -> bool:
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    return mapped.address <= start and end <= mapped.address + mapped.size_bytes


def smaps_entry(pid: int, path: str) -> dict[str, int]:
    """The kB fields of the one mapping of ``path`` in /proc/<pid>/smaps."""
    entries: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            current = {} if len(fields) >= 6 and fields[5] == path else None
            if current is not None:
                entries.append(current)
        elif current is not None and len(fields) == 3 and fields[2] == "kB":
            current[fields[0].rstrip(":")] = int(fields[1])
    assert len(entries) == 1, f"{len(entries)} mappings of {path} in process {pid}"
    return entries[0]


def test_tensors_are_views_of_the_mapping_with_saved_values(tmp_path: Path) -> None:
    tensors = make_tensors()
    path = make_safetensors(tmp_path / "w.safetensors", tensors)
    mapped = MappedFile(path)
    assert mapped.size_bytes == path.stat().st_size
    assert mapped.address % PAGE_SIZE == 0
    for name, (offset, nbytes) in offsets_of(path).items():
        expected = tensors[name]
        view = mapped.tensor(expected.dtype, tuple(expected.shape), offset, nbytes)
        assert view.data_ptr() == mapped.address + offset
        assert inside(mapped, view)
        assert view.dtype == expected.dtype
        assert torch.equal(view, expected)


def test_views_see_the_bytes_on_disk(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "w.safetensors")
    mapped = MappedFile(path)
    raw = mapped.tensor(torch.uint8, (mapped.size_bytes,), 0, mapped.size_bytes)
    assert raw.data_ptr() == mapped.address
    assert raw.numpy().tobytes() == path.read_bytes()


def test_zero_byte_tensor_is_an_empty_tensor(tmp_path: Path) -> None:
    mapped = MappedFile(make_safetensors(tmp_path / "w.safetensors"))
    empty = mapped.tensor(torch.float32, (0, 4), 8, 0)
    assert empty.shape == (0, 4)
    assert empty.dtype == torch.float32


def test_empty_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        MappedFile(tmp_path / "empty")


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        MappedFile(tmp_path / "nope")


@pytest.mark.parametrize(
    ("dtype", "shape", "offset_delta", "nbytes", "message"),
    [
        (torch.float32, (21,), 2, 84, "not aligned to 4 bytes"),
        (torch.float32, (21,), 0, 80, r"80 bytes do not hold \(21,\)"),
        (torch.float32, (21,), 0, 88, r"88 bytes do not hold \(21,\)"),
        (torch.float16, (7, 3), 0, 84, r"84 bytes do not hold \(7, 3\)"),
        (torch.int64, (4,), 4, 32, "not aligned to 8 bytes"),
    ],
    ids=["misaligned-f32", "short-nbytes", "long-nbytes", "wrong-dtype", "misaligned-i64"],
)
def test_bad_views_are_refused(
    tmp_path: Path,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    offset_delta: int,
    nbytes: int,
    message: str,
) -> None:
    path = make_safetensors(tmp_path / "w.safetensors")
    offset, _ = offsets_of(path)["a.f32"]
    with pytest.raises(ValueError, match=message):
        MappedFile(path).tensor(dtype, shape, offset + offset_delta, nbytes)


@pytest.mark.parametrize("where", ["past-end", "straddles-end", "negative"])
def test_out_of_range_views_are_refused(tmp_path: Path, where: str) -> None:
    mapped = MappedFile(make_safetensors(tmp_path / "w.safetensors"))
    size = mapped.size_bytes
    offset = {"past-end": size + 8, "straddles-end": size - 8, "negative": -8}[where]
    with pytest.raises(ValueError, match="outside the file"):
        mapped.tensor(torch.uint8, (16,), offset, 16)


def test_residency_after_prefetch_and_reading_is_the_whole_file(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "w.safetensors", {"x": torch.ones(300_001)})
    assert path.stat().st_size % PAGE_SIZE != 0  # the last page is partial
    mapped = MappedFile(path)
    assert 0 <= mapped.residency() <= mapped.size_bytes
    mapped.prefetch()
    raw = mapped.tensor(torch.uint8, (mapped.size_bytes,), 0, mapped.size_bytes)
    assert int(raw.sum(dtype=torch.int64)) == sum(path.read_bytes())
    assert mapped.residency() == mapped.size_bytes


def test_residency_is_zero_after_the_page_cache_drops_the_file(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "w.safetensors", {"x": torch.ones(300_001)})
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    mapped = MappedFile(path)
    if mapped.residency() != 0:
        pytest.skip("this filesystem keeps clean pages cached (e.g. tmpfs)")
    mapped.prefetch()
    mapped.tensor(torch.uint8, (mapped.size_bytes,), 0, mapped.size_bytes).sum()
    assert mapped.residency() == mapped.size_bytes


def test_close_with_live_views_does_not_raise(tmp_path: Path) -> None:
    mapped = MappedFile(make_safetensors(tmp_path / "w.safetensors"))
    view = mapped.tensor(torch.uint8, (8,), 0, 8)
    mapped.close()
    assert view.numel() == 8  # the mapping stays until the view is collected


def test_mapped_weights_are_views_with_saved_values(tmp_path: Path) -> None:
    weights, manifest = make_mapped_weights(tmp_path)
    tensors = make_tensors()
    assert len(weights.files) == 1
    assert sorted(weights.tensors) == sorted(tensors)
    mapped = weights.files[0]
    for spec in manifest.tensors:
        view = weights.tensors[spec.name]
        assert view.data_ptr() == mapped.address + spec.offset_bytes
        assert inside(mapped, view)
        assert torch.equal(view, tensors[spec.name])


def test_contains_is_true_only_for_mapped_memory(tmp_path: Path) -> None:
    weights, _ = make_mapped_weights(tmp_path)
    for tensor in weights.tensors.values():
        assert weights.contains(tensor)
    assert weights.contains(weights.tensors["a.f32"][2:5])
    assert not weights.contains(torch.randn(7, 3))
    assert not weights.contains(weights.tensors["a.f32"].clone())


def test_mapped_weights_refuse_other_handle_kinds(tmp_path: Path) -> None:
    _, manifest = make_mapped_weights(tmp_path)
    with pytest.raises(ValueError, match="CUDA_IPC cannot be mapped on CPU"):
        MappedWeights(replace(manifest, handle_kind=HandleKind.CUDA_IPC))


CHILD_MAPS_WEIGHTS = """
    import sys
    from pathlib import Path
    from zerolayer.checkpoints.checkpoint import read_checkpoint
    from zerolayer.scheduler.model.weights import MappedWeights
    weights = MappedWeights(read_checkpoint(Path(sys.argv[1])))
    total = sum(float(t.sum()) for t in weights.tensors.values())  # faults in every page
    print("ready", total, flush=True)
    sys.stdin.read()
"""


def test_two_processes_share_one_copy_of_the_weights(tmp_path: Path) -> None:
    tensors = {f"w{i}": torch.full((BIG_TENSOR_NUMEL,), float(i)) for i in range(4)}
    model_dir = make_model_dir(tmp_path / "big", tensors)
    weight_file = str((model_dir / "model.safetensors").resolve())
    weights = MappedWeights(read_checkpoint(model_dir))
    mapped = weights.files[0]
    assert mapped.size_bytes > 64 * 1024 * 1024
    everything = mapped.tensor(torch.uint8, (mapped.size_bytes,), 0, mapped.size_bytes)
    everything.sum(dtype=torch.int64)  # this process touches every page too

    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD_MAPS_WEIGHTS), str(model_dir)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line.split()[:1] == ["ready"], child.stderr.read()
        assert float(line.split()[1]) == BIG_TENSOR_NUMEL * (0 + 1 + 2 + 3)
        child_map = smaps_entry(child.pid, weight_file)
        own_map = smaps_entry(os.getpid(), weight_file)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert child.returncode == 0

    size_kb = (mapped.size_bytes + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE // 1024
    for entry in (child_map, own_map):
        assert entry["Size"] == size_kb
        assert entry["Rss"] == size_kb  # every page mapped in
        assert entry["Anonymous"] == 0  # no copy-on-write copies
        assert entry["Private_Dirty"] == 0
        assert entry["Private_Clean"] == 0  # every page is also mapped by the other process
        assert entry["Shared_Clean"] + entry["Shared_Dirty"] == size_kb
        # Two sharers: each process is charged exactly half of every page.
        assert entry["Pss"] == size_kb // 2


def test_a_file_renamed_into_place_is_refused_and_the_old_mapping_still_serves(
    tmp_path: Path,
) -> None:
    weights, manifest = make_mapped_weights(tmp_path)
    path = manifest.files[0]
    expected = make_tensors()
    new = make_safetensors(tmp_path / "new.safetensors", {"a.f32": torch.zeros(1000)})
    os.replace(new, path)
    with pytest.raises(
        WeightFileChanged,
        match=f"weight file {re.escape(path)} changed since the loader opened it: another file",
    ):
        MappedWeights(manifest)
    weights.files[0].check_unchanged()  # the mapped (old) inode is intact
    assert torch.equal(weights.tensors["a.f32"], expected["a.f32"])


def test_a_manifest_without_identities_maps_whatever_is_at_the_path(tmp_path: Path) -> None:
    _, manifest = make_mapped_weights(tmp_path)
    weights = MappedWeights(replace(manifest, file_identities=()))
    assert torch.equal(weights.tensors["d.i64"], make_tensors()["d.i64"])


def test_a_file_truncated_in_place_is_reported_without_touching_its_pages(tmp_path: Path) -> None:
    """In a child: were mincore or madvise to read a page past the new end, it would die of
    SIGBUS."""
    path = make_safetensors(tmp_path / "w.safetensors", {"x": torch.ones(4 * PAGE_SIZE)})
    script = textwrap.dedent(
        f"""
        import os
        from zerolayer.sharing.file_identity import WeightFileChanged
        from zerolayer.sharing.mapped_file import MappedFile
        f = MappedFile({str(path)!r})
        size = f.size_bytes
        os.truncate({str(path)!r}, 4096)
        try:
            f.check_unchanged()
        except WeightFileChanged as exc:
            print(exc)
        f.prefetch()
        f.residency()
        print("alive")
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
    size = path.stat().st_size
    assert child.stdout.splitlines() == [
        f"weight file {path} changed since the loader opened it: rewritten in place (size "
        f"{16 * PAGE_SIZE + 72} -> {size} bytes, mtime changed: True); its mapping cannot be "
        f"served ({UPDATE_ADVICE})",
        "alive",
    ]
