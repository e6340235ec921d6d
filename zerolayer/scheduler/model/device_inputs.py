"""The step inputs on the model's device: persistent device tensors the host-built inputs are
copied into, asynchronously, once per step (the eager path on a GPU; decode graphs have their own
static inputs, see :mod:`zerolayer.scheduler.model.cuda_graphs`)."""

from __future__ import annotations

import dataclasses

import torch

from zerolayer.scheduler.model.step_inputs import StepInputs

META_FIELDS = ("slot_mapping", "query_start_loc", "seq_lens", "block_tables")
"""The metadata the Triton attention and the KV write read; always copied."""


class DeviceInputs:
    """Device buffers for the step inputs, allocated once (they grow only when a step exceeds
    every earlier one); used by the engine thread only."""

    def __init__(
        self,
        device: torch.device,
        max_tokens: int,
        max_seqs: int,
        max_blocks: int,
        reference_attention: bool = False,
    ) -> None:
        """
        Args:
            device: a CUDA device.
            max_tokens, max_seqs, max_blocks: initial capacity (see
                :class:`~zerolayer.scheduler.model.step_inputs.StepBuffers`).
            reference_attention: attention runs the pure-torch reference here (no Triton), which
                also reads the metadata's ``decode_*`` fields and prefill block tables; those are
                then copied too (plain copies; the Triton path never needs them).
        """
        self.device = torch.device(device)
        self.reference_attention = reference_attention
        self._buffers: dict[str, torch.Tensor] = {}
        for name, size in (
            ("input_ids", max_tokens),
            ("positions", max_tokens),
            ("slot_mapping", max_tokens),
            ("query_start_loc", max_seqs + 1),
            ("seq_lens", max_seqs),
            ("logits_rows", max_seqs),
            ("block_tables", max_seqs * max_blocks),
        ):
            self._buffers[name] = torch.zeros(size, dtype=torch.int64, device=self.device)

    def _copy(self, name: str, source: torch.Tensor) -> torch.Tensor:
        """Copies ``source`` (a contiguous int64 host tensor) into the leading part of a buffer,
        growing the buffer first if it is too small; returns that part, shaped like ``source``."""
        n = source.numel()
        buffer = self._buffers[name]
        if n > buffer.numel():
            buffer = torch.zeros(max(n, 2 * buffer.numel()), dtype=torch.int64, device=self.device)
            self._buffers[name] = buffer
        out = buffer[:n].view(source.shape)
        out.copy_(source, non_blocking=True)
        return out

    def copy(self, inputs: StepInputs) -> StepInputs:
        """The step's inputs on the device (views of the buffers, valid until the next copy).

        The copies are asynchronous from page-locked ``inputs``: the host tensors must stay
        unchanged until the device has run the step (the sampler's read of the logits waits for
        it). Unless :attr:`reference_attention`, the metadata's ``decode_*`` fields and
        ``prefills`` stay the host's (only the reference attention reads their tensors).
        """
        meta = inputs.meta
        moved: dict[str, object] = {
            name: self._copy(name, getattr(meta, name)) for name in META_FIELDS
        }
        if self.reference_attention:
            moved["decode_rows"] = meta.decode_rows.to(self.device)
            moved["decode_block_tables"] = meta.decode_block_tables.to(self.device)
            moved["decode_mask"] = meta.decode_mask.to(self.device)
            moved["prefills"] = tuple(
                dataclasses.replace(span, block_ids=span.block_ids.to(self.device))
                for span in meta.prefills
            )
        return StepInputs(
            input_ids=self._copy("input_ids", inputs.input_ids),
            positions=self._copy("positions", inputs.positions),
            meta=dataclasses.replace(meta, **moved),
            logits_rows=self._copy("logits_rows", inputs.logits_rows),
        )
