"""The log records of a test that runs gRPC's asyncio API, less one kind an earlier test causes.

gRPC's asyncio API has one completion queue per process (``PollerCompletionQueue``), polled by a
thread of its own that hands each completion to the event loop the operation was started on
(grpc's ``src/python/grpcio/grpc/_cython/_cygrpc/aio/completion_queue.pyx.pxi``,
``_handle_events``): the loop that is running calls ``loop.call_soon_threadsafe`` on that loop.
A test that runs its server and client in ``asyncio.run`` closes its loop at the end, and an
operation it started may complete only afterwards (a server's last pending call, a channel's
last batch: later under load). When the next test's loop picks that completion up,
``call_soon_threadsafe`` raises ``RuntimeError('Event loop is closed')`` and asyncio logs
"Exception in callback PollerCompletionQueue._handle_events(...)" at ERROR, with the traceback,
in the next test's records. It says nothing about the code that test runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

CALLBACK = "Exception in callback PollerCompletionQueue._handle_events"
"""How asyncio's default exception handler begins its record of the poller's callback raising."""


def stale_completion(record: logging.LogRecord) -> bool:
    """Whether ``record`` is asyncio's report of gRPC's poller failing to hand a completion to
    an event loop that is closed: logger ``asyncio``, the poller's callback, and exactly
    ``RuntimeError('Event loop is closed')`` (any other exception there still counts)."""
    if record.name != "asyncio" or not record.getMessage().startswith(CALLBACK):
        return False
    exc = record.exc_info[1] if record.exc_info else None
    return type(exc) is RuntimeError and exc.args == ("Event loop is closed",)


def without_stale_completions(records: Iterable[logging.LogRecord]) -> list[logging.LogRecord]:
    """``records`` (e.g. ``caplog.records``) less those :func:`stale_completion` recognizes."""
    return [record for record in records if not stale_completion(record)]
