"""The loader's state: one read-only mapping of each weight file, shared with every importer."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.weight_check import check_weights
from zerolayer.common.errors import NotFound
from zerolayer.sharing.handle_kinds import negotiate
from zerolayer.sharing.manifest import HandleKind, WeightManifest
from zerolayer.sharing.mapped_file import MappedFile

log = logging.getLogger(__name__)


class WeightStore:
    """Maps a checkpoint's weight files (safetensors or GGUF) with mmap and serves their
    manifest.

    The loader keeps its own mapping so that it can report and drive page residency; importers map
    the same files, so the page cache holds one copy however many processes use the weights.

    Raises:
        CheckpointError: the directory is not a loadable checkpoint (from :func:`read_checkpoint`).
        ValueError: config.json describes an unsupported model.
        WeightFileChanged: a file was replaced or rewritten while the directory was read.
    """

    offered_handle_kinds: tuple[HandleKind, ...] = (HandleKind.MMAP_FILE,)

    def __init__(self, model_dir: Path, model_name: str = "", dtype: str = "auto") -> None:
        """``dtype``: ``--dtype`` (see :func:`read_checkpoint`)."""
        self.manifest = read_checkpoint(model_dir, model_name, dtype)
        self.model_config = ModelConfig.from_json(
            self.manifest.config_json, self.manifest.generation_config_json
        )
        check_weights(self.manifest, self.model_config, dtype)
        if self.model_config.max_model_len < self.model_config.max_position_embeddings:
            log.info(
                "serving at most %d tokens per sequence (sliding_window): the window never "
                "applies, so attention is exact",
                self.model_config.max_model_len,
            )
        # NOTE: checked against the identities read_checkpoint saw, so that a file replaced in
        # between is refused instead of mapped under the old header's offsets.
        self._files = [
            MappedFile(p, expected)
            for p, expected in zip(self.manifest.files, self.manifest.file_identities, strict=True)
        ]
        log.info(
            "mapped %d file(s), %d tensors, %.1f MB",
            len(self._files),
            len(self.manifest.tensors),
            self.total_bytes / 1e6,
        )

    @property
    def files(self) -> list[MappedFile]:
        """The mapped weight files (index = ``TensorSpec.file_index``)."""
        return self._files

    @property
    def total_bytes(self) -> int:
        """Bytes of all weight files."""
        return sum(f.size_bytes for f in self._files)

    def get_manifest(self, model: str, accepted: Sequence[HandleKind]) -> WeightManifest:
        """Returns the manifest if ``model`` names this model (or is empty).

        Args:
            accepted: handle kinds the importer can map, preferred first; empty means MMAP_FILE.

        Raises:
            NotFound: another model name.
            FailedPrecondition: none of the accepted handle kinds is offered.
        """
        if model and model != self.manifest.model:
            raise NotFound(f"model: {model!r} is not loaded (serving {self.manifest.model!r})")
        negotiate(accepted, self.offered_handle_kinds)
        return self.manifest

    def check_unchanged(self) -> None:
        """Checks that no mapped file was truncated or rewritten in place (``fstat`` only; no
        page is touched, so a truncated file raises here instead of SIGBUS). A file replaced by
        a rename passes: this process keeps mapping the old inode.

        Raises:
            WeightFileChanged: a file changed in place (the message names it).
        """
        for f in self._files:
            f.check_unchanged()

    def residency(self) -> tuple[int, int]:
        """Returns (total bytes, bytes resident in the page cache); never faults (mincore)."""
        return self.total_bytes, sum(f.residency() for f in self._files)

    def prefetch(self) -> None:
        """Starts kernel read-ahead of every weight file (asynchronous)."""
        for f in self._files:
            f.prefetch()

    def close(self) -> None:
        """Unmaps the files."""
        for f in self._files:
            f.close()
