"""Log probabilities of sampled and prompt tokens.

Every value is the natural log-softmax, in float32, of the RAW logits (the model's, before
temperature, penalties, bias and masks), as the public proto documents. Per position: the token's
logprob, its rank (1 + how many ids are strictly more likely) and the N most likely ids
(``torch.topk``, most likely first; N up to 20).

Prompt logprobs of position j (1 <= j < P) come from the logits at position j - 1, so a request
that asks for them computes its whole prompt (:meth:`Request.needs_prompt_logprobs`: no cached
prefix). They are computed chunk by chunk during prefill (:func:`prompt_logprobs_spans`, in
pieces of at most :data:`MAX_PROMPT_LOGPROBS_ROWS` rows), held on the request, and delivered with
its next output, i.e. the first sampled token. A recompute after preemption does not compute the
positions already done, so none is delivered twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from zerolayer.common.generation import PositionLogprobs, RequestOutput, TokenLogprob
from zerolayer.scheduler.core.request import Request
from zerolayer.scheduler.core.scheduler_output import SchedulerOutput

MAX_PROMPT_LOGPROBS_ROWS = 256
"""Prompt positions whose [rows, vocab] logits are materialized at once."""


def position_logprobs(
    logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]
) -> list[PositionLogprobs]:
    """Logprobs of ``token_ids[i]`` under row i of ``logits``, with its rank and top alternatives.

    Args:
        logits: [N, V] raw logits (any float dtype, any device).
        token_ids: N ids below V.
        num_top: N counts of alternatives (0 to 20).

    Returns:
        N entries, on the host.
    """
    logprobs = logits.float().log_softmax(dim=-1)
    ids = torch.tensor(list(token_ids), dtype=torch.int64, device=logits.device)
    chosen = logprobs.gather(1, ids.unsqueeze(1))
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    chosen_values = chosen.squeeze(1).tolist()
    k = max(num_top, default=0)
    top_values: list[list[float]] = [[] for _ in token_ids]
    top_ids: list[list[int]] = [[] for _ in token_ids]
    if k:
        values, indices = logprobs.topk(k, dim=-1)
        top_values, top_ids = values.tolist(), indices.tolist()
    return [
        PositionLogprobs(
            TokenLogprob(token_id, chosen_values[i]),
            ranks[i],
            tuple(
                TokenLogprob(t, v) for t, v in zip(top_ids[i][:n], top_values[i][:n], strict=True)
            ),
        )
        for i, (token_id, n) in enumerate(zip(token_ids, num_top, strict=True))
    ]


def sampled_logprobs(
    logits: torch.Tensor, requests: Sequence[Request], token_ids: Sequence[int]
) -> dict[tuple[str, int], PositionLogprobs]:
    """Logprobs of the tokens just sampled, for the requests that asked, by (request id, sample
    index) (the samples of a request with n > 1 share its id).

    Args:
        logits: float32 [B, V] raw logits, row i for ``requests[i]``.
        token_ids: B sampled ids.
    """
    rows = [i for i, r in enumerate(requests) if r.logprobs is not None]
    if not rows:
        return {}
    index = torch.tensor(rows, device=logits.device)
    entries = position_logprobs(
        logits.index_select(0, index),
        [token_ids[i] for i in rows],
        [requests[i].logprobs or 0 for i in rows],
    )
    return {
        (requests[i].request_id, requests[i].index): e for i, e in zip(rows, entries, strict=True)
    }


@dataclass(frozen=True)
class PromptLogprobsSpan:
    """Rows of a step's hidden states whose logits give prompt logprobs of one request."""

    request: Request
    first_row: int
    """Row (in the step's flattened tokens) of the first position."""
    token_ids: tuple[int, ...]
    """The next prompt token of each position, in order (one per row)."""


def prompt_logprobs_spans(output: SchedulerOutput) -> list[PromptLogprobsSpan]:
    """The prompt positions of this step that still need logprobs, per request, in the row
    order of :meth:`StepBuffers.fill` (requests in scheduling order, their tokens in order)."""
    spans: list[PromptLogprobsSpan] = []
    row = 0
    for item in output.scheduled:
        request = item.request
        if request.needs_prompt_logprobs:
            # Position p gives the logprob of prompt token p + 1; positions < done are done.
            first = max(item.num_computed_tokens, request.num_prompt_logprobs_done)
            end = min(item.num_computed_tokens + item.num_new_tokens, request.num_prompt_tokens - 1)
            if end > first:
                next_ids = tuple(request.prompt_token_ids[first + 1 : end + 1])
                spans.append(
                    PromptLogprobsSpan(request, row + first - item.num_computed_tokens, next_ids)
                )
        row += item.num_new_tokens
    return spans


def compute_prompt_logprobs(
    hidden: torch.Tensor,
    spans: Sequence[PromptLogprobsSpan],
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, list[PositionLogprobs]]:
    """Prompt logprobs of each span, by request id (in pieces of at most
    :data:`MAX_PROMPT_LOGPROBS_ROWS` rows of logits).

    Args:
        hidden: [T, hidden_size] hidden states of the step's tokens.
        compute_logits: [N, hidden_size] -> float32 [N, V] (the model's head).
    """
    computed: dict[str, list[PositionLogprobs]] = {}
    for span in spans:
        num_top = span.request.prompt_logprobs or 0
        entries = computed.setdefault(span.request.request_id, [])
        for start in range(0, len(span.token_ids), MAX_PROMPT_LOGPROBS_ROWS):
            ids = span.token_ids[start : start + MAX_PROMPT_LOGPROBS_ROWS]
            first = span.first_row + start
            logits = compute_logits(hidden[first : first + len(ids)])
            entries += position_logprobs(logits, ids, [num_top] * len(ids))
    return computed


def record_prompt_logprobs(
    output: SchedulerOutput, computed: dict[str, list[PositionLogprobs]]
) -> None:
    """Holds a step's prompt logprobs on their requests until their next output."""
    for item in output.scheduled:
        entries = computed.get(item.request.request_id)
        if entries:
            item.request.pending_prompt_logprobs += entries
            item.request.num_prompt_logprobs_done += len(entries)


def with_logprobs(
    results: Sequence[RequestOutput],
    requests: Sequence[Request],
    sampled: dict[tuple[str, int], PositionLogprobs],
) -> list[RequestOutput]:
    """``results`` with each one's sampled-token logprobs and the prompt logprobs its request
    holds (which are then delivered: the request's pending list is emptied).

    Args:
        requests: the requests that sampled this step (each result's among them).
    """
    by_id = {(r.request_id, r.index): r for r in requests}
    out: list[RequestOutput] = []
    for result in results:
        key = (result.request_id, result.index)
        request = by_id.get(key)
        entry = sampled.get(key)
        if request is None or (entry is None and not request.pending_prompt_logprobs):
            out.append(result)
            continue
        prompt = tuple(request.pending_prompt_logprobs)
        request.pending_prompt_logprobs = []
        logprobs = (entry,) if entry is not None else ()
        out.append(replace(result, logprobs=logprobs, prompt_logprobs=prompt))
    return out
