"""The KV arena: one shared-memory file holding every layer's K and V blocks.

Its layout is :class:`zerolayer.kv.arena_layout.ArenaLayout`.

The arena outlives the kvstore process: a restarted kvstore reopens the same file (same inode,
so the scheduler's mapping stays valid) when a sidecar ``<path>.json`` records the same layout.
The sidecar also records the owners' last epochs (:mod:`zerolayer.kvstore.owners`), which a new
arena at the same path carries on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path

from zerolayer.kv.arena_file import ArenaSizeError, check_arena_fits, free_bytes, sidecar_path
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kvstore.owners import OwnerRecord


class Arena:
    """Owns the arena's shared-memory file.

    A new file has all its pages reserved up front (``posix_fallocate``): a sparse file on a
    tmpfs smaller than the arena would let the scheduler's first write to a page beyond the free
    space die of SIGBUS, and a restarted scheduler die again the same way. An existing file with
    a matching sidecar is reopened as it is (``reopened`` is True, contents kept).

    Raises:
        ArenaSizeError: the layout has no blocks, or the filesystem cannot hold the arena (the
            partly created file is removed again).
    """

    def __init__(self, path: str, layout: ArenaLayout) -> None:
        if layout.num_blocks <= 0:
            raise ArenaSizeError("too small for a single KV block")
        self.path = path
        self.layout = layout
        previous = self._read_sidecar()
        self._owners = _owners_from_json((previous or {}).get("owners"))
        self.reopened = (
            previous is not None
            and previous.get("layout") == dataclasses.asdict(layout)
            and os.path.exists(path)
            and os.path.getsize(path) == layout.size_bytes
        )
        if self.reopened:
            self.arena_id = str(previous["arena_id"])
            return
        self.arena_id = uuid.uuid4().hex
        Path(path).parent.mkdir(parents=True, exist_ok=True)
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
        with open(path + ".tmp", "w") as f:
            json.dump(content, f)
        os.replace(path + ".tmp", path)

    def _create(self) -> None:
        """Creates the file (emptying an old one first) and reserves every page of it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # NOTE: checked after O_TRUNC, which gives back the pages of an arena of another layout.
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
        try:
            with open(sidecar_path(self.path)) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError):
            return None

    def unlink(self) -> None:
        """Removes the shared-memory file and its sidecar (mappings stay valid until unmapped)."""
        for p in (self.path, sidecar_path(self.path)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


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
