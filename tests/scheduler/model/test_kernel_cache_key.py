"""The native kernels' cache directory is keyed by what the build depends on, so two checkouts or
virtual environments sharing ``~/.cache`` each build once instead of rebuilding each other's
library on every start (issue 18: 61-77 s starts instead of 3.5-5 s)."""

from __future__ import annotations

import shutil
from pathlib import Path

from zerolayer.scheduler.model.kernels import CSRC_DIR, build_key, default_build_dir


def checkout(root: Path) -> Path:
    """A copy of csrc/ in another directory (a second clone)."""
    return Path(shutil.copytree(CSRC_DIR, root / "csrc"))


def test_another_checkout_or_venv_gets_its_own_build_dir(tmp_path: Path) -> None:
    torch_dir = Path("/venv-a/torch")
    first = build_key(CSRC_DIR, torch_dir)
    assert build_key(CSRC_DIR, torch_dir) == first  # stable
    assert build_key(checkout(tmp_path), torch_dir) != first  # the path is in the command line
    assert build_key(CSRC_DIR, Path("/venv-b/torch")) != first  # so is torch's


def test_an_edited_source_gets_a_new_build_dir(tmp_path: Path) -> None:
    copy = checkout(tmp_path)
    before = build_key(copy, Path("/t"))
    (copy / "paged_attention.cpp").write_text((copy / "paged_attention.cpp").read_text() + "\n")
    assert build_key(copy, Path("/t")) != before


def test_the_default_dir_names_torch_python_and_the_key(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZEROLAYER_KERNEL_CACHE", str(tmp_path))
    tag = default_build_dir().relative_to(tmp_path).name
    assert tag.startswith("torch") and "-py3" in tag
    assert len(tag.rsplit("-", 1)[1]) == 12
