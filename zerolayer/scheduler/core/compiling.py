"""Constrained requests whose grammar compiles: they wait here, outside the scheduler, until the
compile thread is done (:meth:`GrammarBackend.compile`), so that the batch never waits for a
compile; the engine then admits them (:meth:`EngineCore.admit_compiled`).

Touched by the thread that steps only; the compile thread reports through the futures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait

from zerolayer.common.errors import ZerolayerError
from zerolayer.common.structured_output import bounded
from zerolayer.scheduler.core.engine_commands import AddRequest
from zerolayer.scheduler.model.structured_output import CompiledGrammar, GrammarBackend


class CompilingRequests:
    """The requests whose grammar compiles, by request id."""

    def __init__(self, on_compiled: Callable[[], None]) -> None:
        """Args:
        on_compiled: called on the compile thread when a compile ends (wakes the engine).
        """
        self._pending: dict[str, tuple[AddRequest, Future]] = {}
        self.on_compiled = on_compiled

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, command: AddRequest, grammar: GrammarBackend) -> None:
        """Starts compiling the request's grammar. A failover resubmission's prompt ends with the
        lost scheduler's output, which the grammar consumes first so that it continues where
        that one left it."""
        request = command.request
        assert request.structured_output is not None
        num_prompt = len(request.prompt_token_ids)
        resumed = request.prompt_token_ids[num_prompt - request.num_resumed_output_tokens :]
        compiled = grammar.compile(request.structured_output, resumed)
        self._pending[request.request_id] = (command, compiled)
        compiled.add_done_callback(lambda _: self.on_compiled())

    def discard(self, request_id: str) -> None:
        """Forgets the request (its compile runs to its end, unused)."""
        self._pending.pop(request_id, None)

    def clear(self) -> list[str]:
        """Forgets every request; returns their ids."""
        request_ids = list(self._pending)
        self._pending.clear()
        return request_ids

    def done(self) -> Iterator[tuple[AddRequest, CompiledGrammar | ZerolayerError]]:
        """Takes out each request whose compile ended, with its compiled grammar or the error
        that ends it (InvalidArgument for a refused constraint; any other failure a bounded
        ZerolayerError)."""
        for request_id, (command, compiled) in list(self._pending.items()):
            if not compiled.done():
                continue
            del self._pending[request_id]
            try:
                yield command, compiled.result()
            except ZerolayerError as exc:
                yield command, exc
            except Exception as exc:  # noqa: BLE001 - the request fails, the engine serves on
                yield command, ZerolayerError(f"structured output: {bounded(repr(exc))}")

    def wait(self, timeout_s: float) -> None:
        """Waits until one compile ends, at most ``timeout_s`` seconds."""
        if self._pending:
            wait([compiled for _, compiled in self._pending.values()], timeout_s, FIRST_COMPLETED)
