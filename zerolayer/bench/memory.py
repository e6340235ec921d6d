"""The memory a process uses, as Linux reports it (``/proc/PID/status`` and ``/proc/PID/smaps``).

A model's weights are mapped, not loaded, so a process's resident set is two different things:
its own memory (``RssAnon``: heaps, buffers, a dequantized copy if it made one) and pages of files
it maps (``RssFile``: the weight file's pages it touched, which the page cache holds once however
many processes map them). :func:`process_memory` reports both, and for the weight files the bytes
mapped and the bytes of those mappings that are resident. Source: proc(5) (``/proc/pid/status``:
VmRSS, RssAnon, RssFile, RssShmem; ``/proc/pid/smaps``: Size and Rss per mapping, in kB).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

KIB = 1024


def _status_bytes(pid: int) -> dict[str, int]:
    fields = {"VmRSS": "rss_bytes", "RssAnon": "anon_bytes", "RssFile": "file_bytes"}
    fields["RssShmem"] = "shmem_bytes"
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            out[fields[name]] = int(value.split()[0]) * KIB
    return out


def _mapped_bytes(pid: int, paths: set[str]) -> dict[str, int]:
    """Size and Rss of every mapping of one of ``paths`` in ``/proc/PID/smaps``."""
    size = rss = 0
    current: str | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if not head:
            continue
        if "-" in head[0] and len(head) >= 5:  # a mapping's header line: range perms ... [path]
            current = head[5] if len(head) > 5 else None
        elif current in paths and head[0] == "Size:":
            size += int(head[1]) * KIB
        elif current in paths and head[0] == "Rss:":
            rss += int(head[1]) * KIB
    return {"weights_mapped_bytes": size, "weights_resident_bytes": rss}


def process_memory(pid: int, weight_files: Iterable[str | Path] = ()) -> dict[str, int]:
    """What process ``pid`` uses now: ``rss_bytes`` (VmRSS) = ``anon_bytes`` + ``file_bytes``
    + ``shmem_bytes`` (the KV arena is shared memory), and, for the mappings of
    ``weight_files``, ``weights_mapped_bytes`` (their size) and ``weights_resident_bytes``
    (their resident part). Bytes.

    Raises:
        OSError: the process is gone or its /proc files cannot be read.
    """
    paths = {str(Path(p).resolve()) for p in weight_files}
    return {**_status_bytes(pid), **_mapped_bytes(pid, paths)}


def total_memory(per_process: dict[str, dict[str, int]]) -> dict[str, int]:
    """The sums over processes of each figure of :func:`process_memory`, with
    ``unique_bytes``: their own memory (anon) plus the largest resident part of the weight files
    in any one of them (shared pages counted once; the KV arena's shared memory left out)."""
    keys = sorted({k for figures in per_process.values() for k in figures})
    out = {k: sum(f.get(k, 0) for f in per_process.values()) for k in keys}
    resident = max((f.get("weights_resident_bytes", 0) for f in per_process.values()), default=0)
    out["unique_bytes"] = out.get("anon_bytes", 0) + resident
    return out
