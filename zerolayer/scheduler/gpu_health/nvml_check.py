"""A self-check of the scheduler's NVML wiring on a real GPU, for the device check script:
``python -m zerolayer.scheduler.gpu_health.nvml_check [CUDA_INDEX]`` prints a JSON report and
exits 1 when a check fails.

It checks what CPU-only tests cannot: that event types the device reports as supported are
registered (:class:`NvmlEventSource`; a type the driver refuses, as some VMs do, is a note, as the
runtime goes on without it), that a wait returns (an event or the timeout), that the recovery
action field reads (a problem only when its event type is registered), that polling
(:class:`GpuPoller` over :class:`NvmlSource`) reads sane values, and that torch's UUID for the
CUDA device finds the same device in NVML.
"""

from __future__ import annotations

import json
import sys
import time

from prometheus_client import CollectorRegistry

from zerolayer.scheduler.gpu_health.events import (
    NVML_EVENT_TYPES,
    NvmlEventSource,
    read_recovery_action,
    wanted_event_mask,
)
from zerolayer.scheduler.gpu_health.monitor import (
    THROTTLE_REASONS,
    GpuPoller,
    NvmlSource,
    open_nvml,
)


def nvml_self_check(
    device_index: int = 0,
    num_samples: int = 5,
    uuid: str | None = None,
    opened: tuple[object, object] | None = None,
) -> dict:
    """Runs the checks on one device.

    Args:
        device_index: CUDA device index.
        uuid: its NVML UUID (``GPU-...``), e.g. from torch; None: looked up by index.
        opened: ``(pynvml, handle)`` already open (tests pass a fake); None: :func:`open_nvml`.

    Returns:
        ``ok`` (no problem found), ``problems``, ``notes``, the ``supported``/``wanted``/
        ``registered`` event masks, the registered ``event_types``, what one 100 ms ``wait``
        returned, the ``recovery_action`` field's value (or its error), and the ``samples``
        polled 100 ms apart.
    """
    report: dict = {"ok": False, "problems": [], "notes": []}
    opened = opened or open_nvml(device_index, uuid)
    if opened is None:
        report["problems"].append("NVML unavailable (no nvidia-ml-py, driver or device)")
        return report
    nvml, handle = opened
    if uuid is not None:
        try:
            nvml.nvmlDeviceGetHandleByUUID(uuid)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001
            report["problems"].append(f"NVML does not know torch's UUID {uuid}: {exc}")
    _check_events(nvml, handle, report)
    _check_samples(nvml, handle, num_samples, report)
    report["ok"] = not report["problems"]
    return report


def _check_events(nvml: object, handle: object, report: dict) -> None:
    supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))  # type: ignore[attr-defined]
    wanted = wanted_event_mask(nvml)
    report.update(supported_mask=supported, wanted_mask=wanted)
    try:
        source = NvmlEventSource.open(nvml, handle)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        report["problems"].append(f"event registration failed: {type(exc).__name__}: {exc}")
        return
    try:
        report["registered_mask"] = source.registered_mask
        report["event_types"] = _names(nvml, source.registered_mask)
        refused = supported & wanted & ~source.registered_mask
        if refused:
            report["notes"].append(
                f"the driver refused {', '.join(_names(nvml, refused))} (0x{refused:x}); the "
                "scheduler runs without them"
            )
        event = source.wait(100)
        report["wait"] = "timeout" if event is None else f"{event.kind.value} {event.data}"
    except Exception as exc:  # noqa: BLE001
        report["problems"].append(f"event wait failed: {type(exc).__name__}: {exc}")
    finally:
        source.close()
    _check_recovery_action(nvml, handle, report)


def _names(nvml: object, mask: int) -> list[str]:
    """The :data:`NVML_EVENT_TYPES` names whose bits are in ``mask``."""
    return [name for name in NVML_EVENT_TYPES if mask & int(getattr(nvml, name, 0) or 0)]


def _check_recovery_action(nvml: object, handle: object, report: dict) -> None:
    try:
        report["recovery_action"] = read_recovery_action(nvml, handle)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        report["recovery_action"] = f"{type(exc).__name__}: {exc}"
        registered = "nvmlEventTypeGpuRecoveryAction" in report.get("event_types", ())
        (report["problems"] if registered else report["notes"]).append(
            f"reading the recovery action field failed: {report['recovery_action']}"
        )


def _check_samples(nvml: object, handle: object, num_samples: int, report: dict) -> None:
    total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)  # type: ignore[attr-defined]
    registry = CollectorRegistry()
    poller = GpuPoller(NvmlSource(nvml, handle), registry)
    known = sum(THROTTLE_REASONS)
    samples = []
    for i in range(num_samples):
        if i:
            time.sleep(poller.interval_s)
        s = poller.poll_once()
        samples.append(
            {
                "sm_utilization_percent": s.sm_utilization_percent,
                "memory_used_bytes": s.memory_used_bytes,
                "clock_event_reasons": s.clock_event_reasons,
            }
        )
        if not 0 <= s.sm_utilization_percent <= 100:
            report["problems"].append(f"SM utilisation {s.sm_utilization_percent} not in 0..100")
        if not 0 < s.memory_used_bytes <= total:
            report["problems"].append(f"memory used {s.memory_used_bytes} not in (0, {total}]")
        if s.clock_event_reasons & ~known:
            report["notes"].append(f"unknown clock event bits 0x{s.clock_event_reasons & ~known:x}")
    report.update(samples=samples, memory_total_bytes=total)
    if (
        registry.get_sample_value("zerolayer_gpu_memory_used_bytes")
        != samples[-1]["memory_used_bytes"]
    ):
        report["problems"].append("the memory gauge does not hold the last sample")


def main(argv: list[str]) -> int:
    """Prints the report of CUDA device ``argv[0]`` (default 0); 0 when it is ok."""
    index = int(argv[0]) if argv else 0
    uuid = None
    try:
        from zerolayer.scheduler.gpu_health.watch import cuda_uuid

        uuid = cuda_uuid(index)
    except Exception as exc:  # noqa: BLE001 - no torch CUDA: look the device up by index
        print(f"no CUDA UUID from torch ({exc}); NVML index {index}", file=sys.stderr)
    report = nvml_self_check(index, uuid=uuid)
    report["uuid"] = uuid
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
