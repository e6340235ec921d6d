"""The user's cache of models zerolayer writes itself (the default model, dummy models).

A cached model is a directory ``<cache_dir>/models/<name>``. It is written once into a temporary
sibling ``.<name>-<pid>-<random>`` and renamed into place, so concurrent first runs never see a
half-written directory; siblings of writers that died mid-write are removed by the next writer.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from zerolayer.checkpoints.model_files import MODEL_DIR_MODE
from zerolayer.common.process import process_exists


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/zerolayer`` or ``~/.cache/zerolayer`` (read when called, not at import)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zerolayer"


def remove_abandoned_writes(target: Path) -> list[Path]:
    """Removes temporary siblings of ``target`` left by writers that died mid-write.

    A writer killed by a signal (SIGTERM, SIGKILL) never reaches its cleanup; its directory is
    named ``.<target>-<pid>-<random>``, and is removed once no process ``<pid>`` exists. Returns
    the removed directories.
    """
    removed = []
    for path in target.parent.glob(f".{target.name}-*-*"):
        pid_text = path.name[len(target.name) + 2 :].split("-", 1)[0]
        if not pid_text.isdigit() or process_exists(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
    return True


def ensure_cached_model(name: str, write: Callable[[Path], object], cache_dir: Path | None) -> Path:
    """Returns ``<cache_dir>/models/<name>``, calling ``write(directory)`` once if it is missing.

    ``write`` fills the empty directory it is given with a whole model (``model.safetensors``
    among its files); that directory appears under ``name`` only once ``write`` returned. It is
    0755 whatever the umask (:mod:`zerolayer.checkpoints.model_files`).

    Args:
        cache_dir: None: :func:`default_cache_dir`.

    Raises:
        OSError: the cache cannot be written (not when another process wrote it meanwhile).
        Exception: whatever ``write`` raises.
    """
    target = (cache_dir or default_cache_dir()) / "models" / name
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_writes(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-{os.getpid()}-", dir=target.parent))
    try:
        write(tmp)
        os.chmod(tmp, MODEL_DIR_MODE)  # mkdtemp's 0700 would hide it from other users
        os.rename(tmp, target)
    except OSError:
        if not (target / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
