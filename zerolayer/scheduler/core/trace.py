"""What the core records of one request's life for tracing: the hooks it calls, as a Protocol.

The core does not import OpenTelemetry. The scheduler process gives each traced request a
:class:`zerolayer.scheduler.request_trace.RequestTrace`, which turns these hooks into spans
(queue, context load, prefill, decode); untraced requests have no trace (None). Every hook is
called on the engine thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from zerolayer.common.generation import FinishReason


@runtime_checkable
class RequestTraceHooks(Protocol):
    """The calls the scheduler and the engine make on a request's trace, in the order of a
    request's life: ``context_load`` (with ``set_context`` inside) once per admission attempt,
    ``admitted``, ``first_token``, ``finished``; ``add_event`` at any time in between."""

    def context_load(self) -> AbstractContextManager[object]:
        """Wraps one admission attempt: the prefix lookup and the block allocation (kvstore
        calls made inside may nest under it). Attempts after the first successful one record
        nothing."""
        ...

    def attached(self) -> AbstractContextManager[object]:
        """Wraps a kvstore call made for this request alone (a block allocation, a free), on
        the engine thread, so that the call joins the request's trace."""
        ...

    def set_context(
        self, num_prompt_tokens: int, num_cached_tokens: int, num_pinned_tokens: int = 0
    ) -> None:
        """Inside :meth:`context_load`: how many of the prompt's tokens the prefix cache held,
        and of those how many a kvstore pin held (a pinned-prefix hit)."""
        ...

    def admitted(self) -> None:
        """The request got its blocks; its prefill starts."""
        ...

    def first_token(self) -> None:
        """The request's first output token was sampled (the end of its prefill)."""
        ...

    def finished(
        self,
        reason: FinishReason,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        num_output_tokens: int,
        num_preemptions: int,
    ) -> None:
        """The request left the scheduler (finished, aborted or failed) with these counts."""
        ...

    def add_event(self, name: str, attributes: Mapping[str, str | int]) -> None:
        """Records an event that happened while the request was in flight (e.g. a GPU event)."""
        ...
