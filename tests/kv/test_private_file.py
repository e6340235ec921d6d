"""Files the stack keeps in shared places: created exclusively with mode 0600, reopened only when
they are still this user's private regular files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from zerolayer.kv.private_file import UntrustedFileError, create_private, open_private


def make_file(path: Path, mode: int, content: bytes = b"data") -> Path:
    path.write_bytes(content)
    path.chmod(mode)
    return path


def reason_of_open(path: Path, flags: int = os.O_RDWR) -> str:
    with pytest.raises(UntrustedFileError) as info:
        open_private(str(path), flags)
    return info.value.reason


def test_create_private_makes_a_0600_file(tmp_path: Path) -> None:
    fd = create_private(str(tmp_path / "f"))
    os.write(fd, b"kv")
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o600
    assert (tmp_path / "f").read_bytes() == b"kv"


def test_create_private_refuses_an_existing_file_and_leaves_it(tmp_path: Path) -> None:
    path = make_file(tmp_path / "f", 0o666)
    with pytest.raises(UntrustedFileError) as info:
        create_private(str(path))
    assert info.value.reason == (
        f"{path} appeared while it was being created (not written to: someone else made it)"
    )
    assert str(info.value) == f"shm_path: {info.value.reason}"
    assert path.read_bytes() == b"data"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666


def test_create_private_does_not_follow_a_symlink(tmp_path: Path) -> None:
    target = make_file(tmp_path / "target", 0o600)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UntrustedFileError):
        create_private(str(tmp_path / "link"))
    assert target.read_bytes() == b"data"


def test_open_private_opens_this_users_0600_file(tmp_path: Path) -> None:
    path = make_file(tmp_path / "f", 0o600)
    fd = open_private(str(path), os.O_RDONLY)
    try:
        assert os.read(fd, 10) == b"data"
        assert os.get_blocking(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640, 0o604, 0o601, 0o610])
def test_open_private_refuses_a_file_open_to_others(tmp_path: Path, mode: int) -> None:
    path = make_file(tmp_path / "f", mode)
    assert reason_of_open(path) == (
        f"{path} has mode {mode:04o}, open to other users (the stack makes its files 0600)"
    )


def test_open_private_refuses_a_symlink_to_this_users_private_file(tmp_path: Path) -> None:
    target = make_file(tmp_path / "target", 0o600)
    (tmp_path / "link").symlink_to(target)
    assert (
        reason_of_open(tmp_path / "link")
        == f"{tmp_path / 'link'} is a symbolic link (not followed)"
    )


def test_open_private_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo", 0o600)
    (tmp_path / "dir").mkdir(mode=0o700)
    for flags in (os.O_RDONLY, os.O_RDWR):  # O_RDONLY on a FIFO would block without O_NONBLOCK
        for name in ("fifo", "dir"):
            reason = reason_of_open(tmp_path / name, flags)
            assert reason == f"{tmp_path / name} is not a regular file"


def test_open_private_refuses_another_users_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_file(tmp_path / "f", 0o600)
    owner = path.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 4242)
    assert reason_of_open(path) == (
        f"{path} is owned by uid {owner}, not by this user (uid {owner + 4242})"
    )


def test_open_private_of_nothing_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_private(str(tmp_path / "none"))
