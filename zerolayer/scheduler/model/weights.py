"""Mapping the loader's weight handles into this process without copying."""

from __future__ import annotations

import torch

from zerolayer.checkpoints.dtypes import torch_dtype
from zerolayer.checkpoints.gguf.tensor_types import byte_shape, is_quantized
from zerolayer.checkpoints.weight_check import gguf_architecture
from zerolayer.sharing.manifest import HandleKind, TensorSpec, WeightManifest
from zerolayer.sharing.mapped_file import MappedFile


class MappedWeights:
    """The model's tensors as views of read-only file mappings (HANDLE_KIND_MMAP_FILE).

    A float tensor (F32, F16, BF16 ...) is a tensor of its dtype and shape; a tensor of a
    quantized GGUF type (Q8_0, Q4_K ...) of shape [..., K] is a uint8 tensor
    [..., K // block_size * type_size] viewing its blocks in place, its type in
    :attr:`quant_types`.

    Raises:
        ValueError: the manifest uses a handle kind this importer cannot map, or a tensor range is
            invalid.
        OSError: a weight file cannot be mapped.
        WeightFileChanged: a file is not the one the loader mapped (see :func:`mapped_files`).
    """

    def __init__(self, manifest: WeightManifest) -> None:
        if manifest.handle_kind != HandleKind.MMAP_FILE:
            raise ValueError(f"handle kind {manifest.handle_kind.name} cannot be mapped on CPU")
        self.files = mapped_files(manifest)
        self.tensors: dict[str, torch.Tensor] = {t.name: self._view(t) for t in manifest.tensors}
        self.quant_types: dict[str, str] = {
            t.name: t.dtype for t in manifest.tensors if is_quantized(t.dtype)
        }
        """Name -> GGUF type name ("Q8_0", "Q4_K" ...) of each quantized tensor."""
        self.model_quant_types: dict[str, str] | None = (
            self.quant_types if gguf_architecture(manifest) else None
        )
        """What ``LlamaModel`` takes as ``quant_types``: :attr:`quant_types` for a GGUF file
        (empty when all its tensors are float ones: the model still computes in the file's
        dtype), None for other checkpoints (they compute in their embedding's dtype)."""

    def _view(self, spec: TensorSpec) -> torch.Tensor:
        mapped = self.files[spec.file_index]
        if is_quantized(spec.dtype):
            shape = byte_shape(spec.dtype, spec.shape)
            return mapped.tensor(torch.uint8, shape, spec.offset_bytes, spec.nbytes)
        return mapped.tensor(torch_dtype(spec.dtype), spec.shape, spec.offset_bytes, spec.nbytes)

    def contains(self, tensor: torch.Tensor) -> bool:
        """True if ``tensor``'s memory lies inside one of the file mappings."""
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        return any(f.address <= start and end <= f.address + f.size_bytes for f in self.files)


def mapped_files(manifest: WeightManifest) -> list[MappedFile]:
    """Maps the manifest's files, each checked against the identity the loader recorded.

    NOTE: the loader hands out paths, and a path may name another file by now (a rename into
    place): viewing it through the loader's offsets would serve other bytes, so it is refused.

    Raises:
        OSError: a file cannot be opened or mapped.
        WeightFileChanged: another file, or another version of it, is at a path now (the message
            names it).
    """
    if not manifest.file_identities:
        return [MappedFile(path) for path in manifest.files]
    return [
        MappedFile(path, expected)
        for path, expected in zip(manifest.files, manifest.file_identities, strict=True)
    ]
