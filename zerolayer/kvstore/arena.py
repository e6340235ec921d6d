"""The KV arena: one shared-memory file holding every layer's K and V blocks.

Its layout is :class:`zerolayer.kv.arena_layout.ArenaLayout`.

The arena outlives the kvstore process: a restarted kvstore reopens the same file (same inode,
so the scheduler's mapping stays valid) when a sidecar ``<path>.json`` records the same layout.
Both files are this user's alone (:mod:`zerolayer.kv.private_file`): created exclusively with mode
0600, and reopened only when they still are. The sidecar also records the owners' last epochs
(:mod:`zerolayer.kvstore.owners`), which a new arena at the same path carries on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path

from zerolayer.kv.arena_file import ArenaSizeError, check_arena_fits, free_bytes, sidecar_path
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kv.private_file import UntrustedFileError, create_private, open_private
from zerolayer.kvstore.owners import OwnerRecord


class Arena:
    """Owns the arena's shared-memory file.

    A new file has all its pages reserved up front (``posix_fallocate``): a sparse file on a
    tmpfs smaller than the arena would let the scheduler's first write to a page beyond the free
    space die of SIGBUS, and a restarted scheduler die again the same way. An existing file with
    a matching sidecar is reopened as it is (``reopened`` is True, contents kept); an existing
    arena of this user's with another layout (or no sidecar) is removed and made anew.

    Raises:
        ArenaSizeError: the layout has no blocks, or the filesystem cannot hold the arena (the
            partly created file is removed again).
        UntrustedFileError: the file or its sidecar is a symlink, not a regular file, another
            user's, or open to other users (neither is written to or removed).
    """

    def __init__(self, path: str, layout: ArenaLayout) -> None:
        if layout.num_blocks <= 0:
            raise ArenaSizeError("too small for a single KV block")
        self.path = path
        self.layout = layout
        previous = self._read_sidecar()
        self._owners = _owners_from_json((previous or {}).get("owners"))
        existing_bytes = _private_size(path)
        self.reopened = (
            previous is not None
            and previous.get("layout") == dataclasses.asdict(layout)
            and existing_bytes == layout.size_bytes
        )
        if self.reopened:
            self.arena_id = str(previous["arena_id"])
            return
        self.arena_id = uuid.uuid4().hex
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if existing_bytes is not None:
            os.unlink(path)  # gives back its pages before the new one is reserved
        try:
            self._create()
        except ArenaSizeError:
            self.unlink()
            raise
        self._write_sidecar()

    def owner_records(self) -> dict[str, OwnerRecord]:
        """The owners' records the sidecar holds (those of an earlier kvstore process)."""
        return dict(self._owners)

    def save_owner_records(self, records: dict[str, OwnerRecord]) -> None:
        """Records the owners in the sidecar (rewritten whole, then renamed over the old one, so
        a crash leaves the old or the new one).

        Raises:
            OSError: the sidecar cannot be written.
        """
        self._owners = dict(records)
        self._write_sidecar()

    def _write_sidecar(self) -> None:
        content = {
            "arena_id": self.arena_id,
            "layout": dataclasses.asdict(self.layout),
            "owners": {k: dataclasses.asdict(v) for k, v in sorted(self._owners.items())},
        }
        path = sidecar_path(self.path)
        tmp = path + ".tmp"
        try:
            os.unlink(tmp)  # a crashed writer's leftover; a symlink is removed, not followed
        except FileNotFoundError:
            pass
        except OSError as exc:  # e.g. another user's file in a sticky directory
            raise UntrustedFileError(f"{tmp} cannot be replaced ({exc.strerror})") from None
        with open(create_private(tmp), "w") as f:
            json.dump(content, f)
        os.replace(tmp, path)  # replaces the name itself: a symlink there is not followed

    def _create(self) -> None:
        """Creates the file exclusively (mode 0600) and reserves every page of it."""
        fd = create_private(self.path)
        try:
            check_arena_fits(self.path, self.layout.size_bytes)
            # Sets the size too; on tmpfs it fails with ENOSPC, giving back what it took.
            os.posix_fallocate(fd, 0, self.layout.size_bytes)
        except OSError as exc:
            raise ArenaSizeError(
                f"cannot reserve the {self.layout.size_bytes} bytes of the KV arena at {self.path}"
                f" ({exc.strerror}); {free_bytes(self.path)} bytes are free there"
            ) from None
        finally:
            os.close(fd)

    def _read_sidecar(self) -> dict | None:
        """The sidecar's content; None when it is missing or damaged.

        Raises:
            UntrustedFileError: it is not this user's private regular file.
        """
        try:
            fd = open_private(sidecar_path(self.path), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            with open(fd) as f:
                content = json.load(f)
        except (OSError, ValueError):  # ValueError: not JSON, not UTF-8
            return None
        return content if isinstance(content, dict) else None

    def unlink(self) -> None:
        """Removes the shared-memory file and its sidecar (mappings stay valid until unmapped)."""
        for p in (self.path, sidecar_path(self.path)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def _private_size(path: str) -> int | None:
    """The size of the arena file at ``path``, None when there is none.

    Raises:
        UntrustedFileError: it is not this user's private regular file.
    """
    try:
        fd = open_private(path)
    except FileNotFoundError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _owners_from_json(owners: object) -> dict[str, OwnerRecord]:
    """The owner records of a sidecar's ``owners`` (none from an older or damaged sidecar)."""
    if not isinstance(owners, dict):
        return {}
    try:
        return {
            str(k): OwnerRecord(int(v["epoch"]), bool(v["released"])) for k, v in owners.items()
        }
    except (KeyError, TypeError, ValueError):
        return {}
