"""Whether a process lives, for the files and directories named after the process that made
them (the model cache's partial conversions, ``zerolayer up``'s run directories)."""

from __future__ import annotations

import os


def process_exists(pid: int) -> bool:
    """Whether a process with ``pid`` exists (another user's included); a reused pid counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
