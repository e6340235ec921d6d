"""The index of a sharded safetensors checkpoint (``model.safetensors.index.json``) and its checks.

Format (Hugging Face transformers, ``save_pretrained`` with ``max_shard_size``): a JSON object whose
``"weight_map"`` maps every tensor name to the name of the shard file that holds it, relative to
the model directory; ``"metadata"`` is informational and ignored here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from zerolayer.checkpoints.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"


def read_weight_map(model_dir: Path) -> dict[str, str] | None:
    """The index's tensor name -> shard file name map; None when the directory has no index.

    Raises:
        CheckpointError: the index is not JSON, has no ``weight_map`` object of strings, names a
            shard by an absolute path or one with ``..`` (outside ``model_dir``), or names a file
            that does not exist (the message names it).
    """
    index = model_dir / INDEX_NAME
    if not index.exists():
        return None
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise CheckpointError(f"{index}: not a JSON object with a weight_map ({exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: weight_map is missing, empty or not an object")
    for name, file_name in weight_map.items():
        if not isinstance(file_name, str) or not file_name:
            raise CheckpointError(
                f"{index}: tensor {name!r} maps to {file_name!r}, not a file name"
            )
        parts = PurePosixPath(file_name).parts
        if PurePosixPath(file_name).is_absolute() or ".." in parts or "\\" in file_name:
            raise CheckpointError(
                f"{index}: tensor {name!r} maps to {file_name!r}, not a file name relative to "
                "the model directory (no absolute path, no '..')"
            )
    for file_name in sorted(set(weight_map.values())):
        if not (model_dir / file_name).is_file():
            raise CheckpointError(f"{index}: shard {file_name!r} does not exist")
    return weight_map


def check_shards(
    model_dir: Path, weight_map: Mapping[str, str], names_by_file: Mapping[str, list[str]]
) -> None:
    """Checks that the shards hold exactly the tensors the index puts in them.

    Args:
        weight_map: from :func:`read_weight_map`.
        names_by_file: shard file name (as in the index) -> tensor names its header lists.

    Raises:
        CheckpointError: a tensor of the index is missing from its shard, or a shard holds a
            tensor the index does not list or puts in another shard (the message names both).
    """
    index = model_dir / INDEX_NAME
    for file_name, names in names_by_file.items():
        for name in names:
            expected = weight_map.get(name)
            if expected is None:
                raise CheckpointError(f"{index}: {file_name} holds tensor {name!r}, not indexed")
            if expected != file_name:
                raise CheckpointError(
                    f"{index}: {file_name} holds tensor {name!r}, which the index puts in "
                    f"{expected}"
                )
    for name, file_name in weight_map.items():
        if name not in names_by_file.get(file_name, ()):
            raise CheckpointError(f"{index}: tensor {name!r} is not in {file_name}")
