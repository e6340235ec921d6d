"""The scheduler's reaction to GPU events: a dedicated thread waits on the event source, classifies
each event (:func:`zerolayer.scheduler.gpu_health.events.classify_event`) and acts on it.

- Every event: the counter ``zerolayer_gpu_events_total{type,xid,severity}``, a log line, and a
  span event ``gpu event`` on the server span of every request in flight (``on_event``).
- The first FATAL event: ``on_fatal`` with a :class:`GpuFault` whose message names the event (e.g.
  "GPU fatal event: Xid 79 (GPU has fallen off the bus)"). The scheduler process wires it to fail
  the engine (requests in flight end with UNAVAILABLE at the next step boundary, their KV blocks
  freed; new requests are refused) and to report NOT_SERVING for good. Later fatal events are
  counted and logged only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from zerolayer.common.errors import Unavailable
from zerolayer.scheduler.gpu_health.events import (
    EventSource,
    GpuEvent,
    NvmlEventSource,
    Verdict,
    classify_event,
)
from zerolayer.scheduler.gpu_health.monitor import GpuPoller, NvmlSource, SampleSource, open_nvml
from zerolayer.scheduler.gpu_health.script import ScriptedGpu
from zerolayer.scheduler.gpu_health.xid import Severity

if TYPE_CHECKING:
    from zerolayer.scheduler.core.engine import Engine

log = logging.getLogger(__name__)

WAIT_TIMEOUT_MS = 100
"""How long one wait on the event source blocks (bounds how long stopping the thread takes)."""

_LOG_LEVELS = {
    Severity.FATAL: logging.ERROR,
    Severity.RECOVERABLE: logging.WARNING,
    Severity.APPLICATION: logging.WARNING,
    Severity.INFO: logging.DEBUG,
}


@dataclass(frozen=True)
class GpuFault:
    """A fatal GPU event: the scheduler stops serving on this GPU."""

    event: GpuEvent
    verdict: Verdict

    @property
    def message(self) -> str:
        """What requests and the health reason say, naming the event."""
        return f"GPU fatal event: {self.verdict.description}; the scheduler stopped serving"


def span_attributes(event: GpuEvent, verdict: Verdict) -> dict[str, str | int]:
    """Attributes of the ``gpu event`` span event."""
    attributes: dict[str, str | int] = {
        "zerolayer.gpu.event": event.kind.value,
        "zerolayer.gpu.severity": verdict.severity.value,
        "zerolayer.gpu.description": verdict.description,
    }
    if event.xid is not None:
        attributes["zerolayer.gpu.xid"] = event.xid
    return attributes


class GpuEventMonitor:
    """Waits for GPU events on its own thread and reacts to them (see the module docstring)."""

    def __init__(
        self,
        source: EventSource,
        registry: CollectorRegistry,
        on_fatal: Callable[[GpuFault], None],
        on_event: Callable[[GpuEvent, Verdict], None] | None = None,
        wait_timeout_ms: int = WAIT_TIMEOUT_MS,
    ) -> None:
        """
        Args:
            on_fatal: called once, on this monitor's thread, with the first fatal event.
            on_event: called on this monitor's thread for every event, before ``on_fatal``.
        """
        self.source = source
        self.fault: GpuFault | None = None
        self._on_fatal = on_fatal
        self._on_event = on_event
        self._wait_timeout_ms = wait_timeout_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-events", daemon=True)
        self.events = Counter(
            "zerolayer_gpu_events",
            "GPU events (NVML) by type, Xid code (empty for other types) and severity",
            ["type", "xid", "severity"],
            registry=registry,
        )

    def start(self) -> None:
        """Starts the thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread (within one wait timeout) and closes the source."""
        self._stop.set()
        self._thread.join(timeout=5)

    def handle(self, event: GpuEvent) -> Verdict:
        """Counts, logs and reacts to one event (the thread calls this; tests may too)."""
        verdict = classify_event(event)
        xid = "" if event.xid is None else str(event.xid)
        self.events.labels(event.kind.value, xid, verdict.severity.value).inc()
        first_fault = verdict.severity is Severity.FATAL and self.fault is None
        if first_fault:
            self.fault = GpuFault(event, verdict)
            log.error("%s: failing the requests in flight, refusing new ones", self.fault.message)
        else:
            log.log(
                _LOG_LEVELS[verdict.severity],
                "GPU %s event: %s",
                verdict.severity.value,
                verdict.description,
            )
        if self._on_event is not None:
            self._on_event(event, verdict)
        if first_fault:
            self._on_fatal(self.fault)  # type: ignore[arg-type]
        return verdict

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    event = self.source.wait(self._wait_timeout_ms)
                except Exception:  # noqa: BLE001 - keep listening; do not spin on a failure
                    log.exception("waiting for GPU events failed; retrying in 1 s")
                    self._stop.wait(1.0)
                    continue
                if event is not None:
                    self.handle(event)
        finally:
            self.source.close()


@dataclass(frozen=True)
class GpuSources:
    """Where the poller's samples and the event thread's events come from (either may be
    missing)."""

    samples: SampleSource | None
    events: EventSource | None


def open_gpu_sources(nvml_script: str, cuda_device: int | None, uuid: str | None) -> GpuSources:
    """The scripted GPU when ``nvml_script`` is set (tests), else NVML for ``cuda_device``, else
    nothing (no GPU, or no nvidia-ml-py)."""
    if nvml_script:
        log.warning("GPU events and samples come from the script %s (test only)", nvml_script)
        scripted = ScriptedGpu(Path(nvml_script))
        return GpuSources(scripted, scripted)
    if cuda_device is None:
        return GpuSources(None, None)
    opened = open_nvml(cuda_device, uuid)
    if opened is None:
        return GpuSources(None, None)
    try:
        events: EventSource | None = NvmlEventSource.open(*opened)
    except Exception as exc:  # noqa: BLE001 - NVMLError or no supported types: poll only
        log.warning("NVML events unavailable (%s): GPU faults are seen only when a step fails", exc)
        events = None
    return GpuSources(NvmlSource(*opened), events)


def start_gpu_monitoring(
    sources: GpuSources,
    registry: CollectorRegistry,
    on_fatal: Callable[[GpuFault], None],
    on_event: Callable[[GpuEvent, Verdict], None] | None = None,
) -> list[GpuPoller | GpuEventMonitor]:
    """Starts the poller (every ~100 ms) and the event thread for the sources that exist; returns
    them (call ``stop()`` on each at shutdown)."""
    started: list[GpuPoller | GpuEventMonitor] = []
    if sources.samples is not None:
        started.append(GpuPoller(sources.samples, registry))
    if sources.events is not None:
        started.append(GpuEventMonitor(sources.events, registry, on_fatal, on_event))
    for monitor in started:
        monitor.start()
    return started


def cuda_uuid(index: int) -> str | None:
    """The UUID of CUDA device ``index`` as NVML spells it (``GPU-...``); None when torch does not
    report one. torch's ``_CUuuid`` prints the bare canonical UUID, without NVML's prefix."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is None or not str(uuid):
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def watch_gpu(
    engine: Engine,
    registry: CollectorRegistry,
    nvml_script: str,
    cuda_device: int | None,
    stop_serving: Callable[[str], object],
) -> list[GpuPoller | GpuEventMonitor]:
    """Starts sampling and the event thread for the engine's GPU (or the test script), wired to
    the engine: every event becomes a span event on the requests in flight; the first fatal one
    fails the engine (:meth:`Engine.fail`) and calls ``stop_serving`` with the reason (from the
    event thread). With no script and ``cuda_device`` None (the engine runs on the CPU), or no
    NVML, nothing starts.

    Args:
        cuda_device: the CUDA ordinal the engine runs on, or None.
    """

    def on_fatal(fault: GpuFault) -> None:
        engine.fail(Unavailable(fault.message))
        stop_serving(fault.message)

    def on_event(event: GpuEvent, verdict: Verdict) -> None:
        engine.annotate("gpu event", span_attributes(event, verdict))

    uuid = None if nvml_script or cuda_device is None else cuda_uuid(cuda_device)
    sources = open_gpu_sources(nvml_script, cuda_device, uuid)
    return start_gpu_monitoring(sources, registry, on_fatal, on_event)
