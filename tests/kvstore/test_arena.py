"""Tests for the KV arena: layout byte math, the reserved 0600 file, refusing an arena that does not
fit or that someone else put at its path, and sharing across processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from zerolayer.kv.arena_file import ArenaSizeError, free_bytes, map_arena, sidecar_path
from zerolayer.kv.arena_layout import ArenaLayout, blocks_for_bytes
from zerolayer.kv.private_file import UntrustedFileError
from zerolayer.kvstore.arena import Arena

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_layout(
    num_layers: int = 2,
    num_kv_heads: int = 2,
    head_dim: int = 8,
    block_size: int = 4,
    dtype: str = "BF16",
    num_blocks: int = 3,
) -> ArenaLayout:
    return ArenaLayout(num_layers, num_kv_heads, head_dim, block_size, dtype, num_blocks)


def make_arena(tmp_path: Path, layout: ArenaLayout | None = None) -> Arena:
    return Arena(str(tmp_path / "kv" / "arena"), layout or make_layout())


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter (a separate process with its own mapping)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_layout_byte_math_bf16() -> None:
    layout = make_layout()
    assert layout.itemsize == 2
    # 2 (K, V) * 2 layers * 4 tokens * 2 heads * 8 dims * 2 bytes
    assert layout.block_bytes == 512
    assert layout.size_bytes == 1536
    assert layout.shape == (2, 2, 3, 4, 2, 8)


def test_layout_byte_math_llama_8b_geometry() -> None:
    layout = ArenaLayout(
        num_layers=32, num_kv_heads=8, head_dim=128, block_size=16, dtype="F16", num_blocks=1000
    )
    assert layout.block_bytes == 2 * 32 * 16 * 8 * 128 * 2 == 2_097_152
    assert layout.size_bytes == 2_097_152_000
    assert layout.shape == (32, 2, 1000, 16, 8, 128)


def test_layout_byte_math_f32() -> None:
    layout = make_layout(num_layers=1, num_kv_heads=1, head_dim=4, block_size=2, dtype="F32")
    assert layout.itemsize == 4
    assert layout.block_bytes == 2 * 1 * 2 * 1 * 4 * 4 == 64
    assert layout.size_bytes == 192


def test_layout_rejects_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="'F8'"):
        _ = make_layout(dtype="F8").block_bytes


def test_blocks_for_bytes_rounds_down() -> None:
    layout = make_layout(num_blocks=0)
    assert blocks_for_bytes(512 * 10, layout) == 10
    assert blocks_for_bytes(512 * 10 + 511, layout) == 10
    assert blocks_for_bytes(511, layout) == 0


def test_arena_reserves_every_page_of_a_private_file(tmp_path: Path) -> None:
    layout = make_layout(num_blocks=4096)  # 2 MiB
    arena = make_arena(tmp_path, layout)
    info = os.stat(arena.path)
    assert arena.path == str(tmp_path / "kv" / "arena")
    assert info.st_size == layout.size_bytes == 2 * 1024 * 1024
    assert stat.S_IMODE(info.st_mode) == 0o600
    # Not sparse: a write to any page can never fail (SIGBUS on a full tmpfs).
    assert info.st_blocks * 512 >= layout.size_bytes
    assert len(arena.arena_id) == 32
    assert arena.arena_id != make_arena(tmp_path / "other", layout).arena_id


def test_arena_larger_than_the_free_space_is_refused_and_removed(tmp_path: Path) -> None:
    layout = make_layout(num_blocks=2**41)  # 1 PiB of 512-byte blocks
    path = tmp_path / "kv" / "arena"
    path.parent.mkdir()
    Path(str(path) + ".json").write_text("{}")  # a stale sidecar of an older arena
    Path(str(path) + ".json").chmod(0o600)
    free = free_bytes(str(tmp_path))
    assert free < 2**50
    with pytest.raises(ArenaSizeError) as info:
        Arena(str(path), layout)
    assert info.value.reason.startswith(f"the KV arena needs {2**50} bytes at {path}, but only ")
    assert info.value.reason.endswith(" bytes are free there")
    free_said = int(info.value.reason.split("only ")[1].split()[0])
    assert abs(free_said - free) < 2**30  # other writers on this filesystem move it a little
    assert str(info.value).startswith("kv_cache_bytes: ")
    assert sorted(path.parent.iterdir()) == []


def test_arena_the_filesystem_refuses_to_reserve_is_refused_and_removed(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes posix_fallocate beyond 1 MiB fail (EFBIG) as a full tmpfs does (ENOSPC),
    # after the free-space check passed: the reservation itself must be checked.
    result = run_python(
        f"""
        import resource
        from zerolayer.kv.arena_file import ArenaSizeError
        from zerolayer.kv.arena_layout import ArenaLayout
        from zerolayer.kvstore.arena import Arena
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            Arena({str(tmp_path / "arena")!r}, {make_layout(num_blocks=4096)!r})
        except ArenaSizeError as exc:
            print(exc.reason)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        f"cannot reserve the 2097152 bytes of the KV arena at {tmp_path / 'arena'} "
        "(File too large); "
    )
    assert list(tmp_path.iterdir()) == []


def test_a_reopened_arena_keeps_its_id_and_contents_without_reserving_again(
    tmp_path: Path,
) -> None:
    layout = make_layout(num_blocks=4096)  # 2 MiB
    arena = make_arena(tmp_path, layout)
    map_arena(arena.path, layout)[1, 0, 7] = 2.5
    # Below the arena's size: a new reservation would fail, reopening takes nothing new.
    result = run_python(
        f"""
        import resource
        from zerolayer.kv.arena_file import map_arena
        from zerolayer.kv.arena_layout import ArenaLayout
        from zerolayer.kvstore.arena import Arena
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        arena = Arena({arena.path!r}, {layout!r})
        kv = map_arena(arena.path, arena.layout)
        print(arena.reopened, arena.arena_id, kv[1, 0, 7, 0, 0, 0].item())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", arena.arena_id, "2.5"]


def test_arena_replaces_this_users_arena_of_another_layout(tmp_path: Path) -> None:
    path = tmp_path / "arena"
    path.write_bytes(b"\xff" * 10_000)
    path.chmod(0o600)
    arena = Arena(str(path), make_layout())
    assert not arena.reopened
    assert path.read_bytes() == b"\0" * 1536
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def reason_of_refusal(path: Path, layout: ArenaLayout) -> str:
    with pytest.raises(UntrustedFileError) as info:
        Arena(str(path), layout)
    return info.value.reason


def chmod_arena(arena: Arena, arena_mode: int, sidecar_mode: int) -> None:
    os.chmod(arena.path, arena_mode)
    os.chmod(sidecar_path(arena.path), sidecar_mode)


@pytest.mark.parametrize(
    ("arena_mode", "sidecar_mode", "refused"),
    [(0o666, 0o666, ".json"), (0o644, 0o600, ""), (0o600, 0o666, ".json")],
)
def test_a_matching_arena_open_to_others_is_refused_not_adopted(
    tmp_path: Path, arena_mode: int, sidecar_mode: int, refused: str
) -> None:
    # As another user would leave it: a file of the right size and a sidecar that matches.
    arena = make_arena(tmp_path)
    map_arena(arena.path, arena.layout)[0, 0, 0] = 1.0
    contents = Path(arena.path).read_bytes(), Path(sidecar_path(arena.path)).read_bytes()
    chmod_arena(arena, arena_mode, sidecar_mode)
    mode = sidecar_mode if refused else arena_mode
    assert reason_of_refusal(Path(arena.path), arena.layout) == (
        f"{arena.path}{refused} has mode {mode:04o}, open to other users "
        "(the stack makes its files 0600)"
    )
    assert (Path(arena.path).read_bytes(), Path(sidecar_path(arena.path)).read_bytes()) == contents
    assert stat.S_IMODE(os.stat(arena.path).st_mode) == arena_mode
    assert stat.S_IMODE(os.stat(sidecar_path(arena.path)).st_mode) == sidecar_mode


def test_an_arena_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arena = make_arena(tmp_path)
    owner = os.stat(arena.path).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    assert reason_of_refusal(Path(arena.path), arena.layout) == (
        f"{sidecar_path(arena.path)} is owned by uid {owner}, not by this user (uid {owner + 1})"
    )
    os.unlink(sidecar_path(arena.path))
    assert reason_of_refusal(Path(arena.path), arena.layout) == (
        f"{arena.path} is owned by uid {owner}, not by this user (uid {owner + 1})"
    )
    assert os.path.exists(arena.path)


@pytest.mark.parametrize("name", ["arena", "arena.json"])
def test_a_symlink_at_the_arena_or_sidecar_path_is_refused_and_its_target_kept(
    tmp_path: Path, name: str
) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    target.chmod(0o600)
    (tmp_path / name).symlink_to(target)
    assert reason_of_refusal(tmp_path / "arena", make_layout()) == (
        f"{tmp_path / name} is a symbolic link (not followed)"
    )
    assert target.read_bytes() == b"precious"
    assert (tmp_path / name).is_symlink()


def test_a_symlink_to_a_matching_arena_is_refused_by_the_kvstore_and_the_scheduler(
    tmp_path: Path,
) -> None:
    arena = make_arena(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(arena.path)
    Path(sidecar_path(str(link))).symlink_to(sidecar_path(arena.path))
    assert reason_of_refusal(link, arena.layout) == (
        f"{sidecar_path(str(link))} is a symbolic link (not followed)"
    )
    with pytest.raises(UntrustedFileError, match="is a symbolic link"):
        map_arena(str(link), arena.layout)


def test_the_scheduler_maps_no_arena_open_to_others(tmp_path: Path) -> None:
    arena = make_arena(tmp_path)
    os.chmod(arena.path, 0o660)
    with pytest.raises(UntrustedFileError, match="has mode 0660"):
        map_arena(arena.path, arena.layout)


def test_a_symlink_at_the_sidecars_temporary_path_is_removed_not_followed(
    tmp_path: Path,
) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    (tmp_path / "arena.json.tmp").symlink_to(target)
    arena = Arena(str(tmp_path / "arena"), make_layout())
    assert target.read_bytes() == b"precious"
    assert not (tmp_path / "arena.json.tmp").exists()
    sidecar = Path(sidecar_path(arena.path))
    assert json.loads(sidecar.read_text())["arena_id"] == arena.arena_id
    assert stat.S_IMODE(sidecar.stat().st_mode) == 0o600


def test_arena_with_no_blocks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArenaSizeError, match="^kv_cache_bytes: too small for a single KV block$"):
        make_arena(tmp_path, make_layout(num_blocks=0))
    assert not (tmp_path / "kv" / "arena").exists()


def test_map_arena_has_layout_shape_and_zeros(tmp_path: Path) -> None:
    arena = make_arena(tmp_path)
    kv = map_arena(arena.path, arena.layout)
    assert kv.shape == (2, 2, 3, 4, 2, 8)
    assert kv.dtype == torch.bfloat16
    assert kv.is_contiguous()
    assert torch.count_nonzero(kv) == 0


def test_two_processes_share_the_arena_bytes(tmp_path: Path) -> None:
    arena = make_arena(tmp_path)
    kv = map_arena(arena.path, arena.layout)  # mapped before the child writes
    kv[0, 1, 1].copy_(torch.arange(64, dtype=torch.bfloat16).view(4, 2, 8))
    result = run_python(
        f"""
        import json
        from zerolayer.kv.arena_file import map_arena
        from zerolayer.kv.arena_layout import ArenaLayout
        kv = map_arena({arena.path!r}, {arena.layout!r})
        print(json.dumps(kv[0, 1, 1].flatten().tolist()))
        kv[1, 0, 2] = 1.5   # layer 1, K, block 2
        kv[0, 1, 0, 3, 1] = -2.0   # layer 0, V, block 0, token 3, head 1
        """
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [float(i) for i in range(64)]
    expected = torch.zeros(arena.layout.shape, dtype=torch.bfloat16)
    expected[0, 1, 1] = torch.arange(64, dtype=torch.bfloat16).view(4, 2, 8)
    expected[1, 0, 2] = 1.5
    expected[0, 1, 0, 3, 1] = -2.0
    assert torch.equal(kv, expected)
    # The bytes sit where the C-contiguous layout says; blocks hold 4 * 2 * 8 = 64 elements.
    raw = Path(arena.path).read_bytes()
    assert raw == expected.view(torch.int16).numpy().tobytes()
    k_offset = ((1 * 2 + 0) * 3 + 2) * 64 * 2  # (layer 1, K, block 2)
    assert raw[k_offset : k_offset + 128] == b"\xc0\x3f" * 64  # bf16 1.5 is 0x3FC0
    v_offset = ((((0 * 2 + 1) * 3 + 0) * 4 + 3) * 2 + 1) * 8 * 2  # (0, V, 0, token 3, head 1)
    assert raw[v_offset : v_offset + 16] == b"\x00\xc0" * 8  # bf16 -2.0 is 0xC000


def test_unlink_removes_the_file_and_is_idempotent(tmp_path: Path) -> None:
    arena = make_arena(tmp_path)
    kv = map_arena(arena.path, arena.layout)
    arena.unlink()
    assert not os.path.exists(arena.path)
    arena.unlink()
    kv[0, 0, 0, 0, 0, 0] = 3.0  # the mapping outlives the name
    assert kv[0, 0, 0, 0, 0, 0].item() == 3.0
    with pytest.raises(FileNotFoundError):
        map_arena(arena.path, arena.layout)


@pytest.mark.parametrize("num_blocks", [2, 4])
def test_map_arena_size_mismatch_is_refused(tmp_path: Path, num_blocks: int) -> None:
    arena = make_arena(tmp_path)
    with pytest.raises(ValueError, match="1536 bytes, layout needs"):
        map_arena(arena.path, replace(arena.layout, num_blocks=num_blocks))


def test_map_arena_dtype_mismatch_is_refused(tmp_path: Path) -> None:
    arena = make_arena(tmp_path)
    with pytest.raises(ValueError, match="1536 bytes, layout needs 3072"):
        map_arena(arena.path, replace(arena.layout, dtype="F32"))
