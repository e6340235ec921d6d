"""One log line per outage of the span exporter, instead of one per export try.

With its collector down, OpenTelemetry's OTLP exporter logs each retry of each batch (a warning
per retry, an error per batch given up) and the batch processor each span it drops for a full
queue: a dead collector fills every layer's log. :class:`ExportOutageLog` lets the first such line
of an outage through and drops the others until an export succeeds again, which it then logs
once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger(__name__)

EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk._shared_internal",
)
"""The loggers of the OTLP gRPC exporter's retries and failures, and of the batch processor's
dropped spans."""


class ExportOutageLog(logging.Filter):
    """A filter for :data:`EXPORT_LOGGERS`: passes their first warning or error after an export
    that worked (or at start), drops the rest until :meth:`export_worked`; passes lower levels."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._in_outage = False

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged."""
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            first, self._in_outage = not self._in_outage, True
        if first:
            record.msg = f"{record.msg} (logged once until an export works again)"
        return first

    def export_worked(self) -> None:
        """Ends an outage (logging that it ended, when there was one)."""
        with self._lock:
            ended, self._in_outage = self._in_outage, False
        if ended:
            log.info("span export works again")

    def install(self) -> None:
        """Puts this filter on :data:`EXPORT_LOGGERS`, in place of one installed before (the
        layer's tracing setup, at its process edge; a test process makes several)."""
        for name in EXPORT_LOGGERS:
            logger = logging.getLogger(name)
            for old in [f for f in logger.filters if isinstance(f, ExportOutageLog)]:
                logger.removeFilter(old)
            logger.addFilter(self)


class OutageReportingExporter(SpanExporter):
    """Passes spans on to ``exporter`` and tells ``outage`` when an export worked."""

    def __init__(self, exporter: SpanExporter, outage: ExportOutageLog) -> None:
        self._exporter = exporter
        self._outage = outage

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Exports ``spans`` through the wrapped exporter."""
        result = self._exporter.export(spans)
        if result == SpanExportResult.SUCCESS:
            self._outage.export_worked()
        return result

    def shutdown(self) -> None:
        """Shuts the wrapped exporter down."""
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flushes the wrapped exporter."""
        return self._exporter.force_flush(timeout_millis)
