"""The Xid and GPU-event classification: which events stop serving."""

from __future__ import annotations

import pytest

from zerolayer.scheduler.gpu_health.events import EventKind, GpuEvent, Verdict, classify_event
from zerolayer.scheduler.gpu_health.xid import (
    XIDS,
    Severity,
    classify_recovery_action,
    classify_xid,
)


@pytest.mark.parametrize("code", [32, 48, 62, 64, 74, 79, 95, 119, 120, 140, 143])
def test_hardware_faults_are_fatal(code: int) -> None:
    assert classify_xid(code).severity is Severity.FATAL


@pytest.mark.parametrize("code", [63, 92, 94, 121])
def test_handled_hardware_errors_are_recoverable(code: int) -> None:
    assert classify_xid(code).severity is Severity.RECOVERABLE


@pytest.mark.parametrize("code", [8, 13, 31, 43, 45])
def test_application_faults_do_not_stop_serving(code: int) -> None:
    assert classify_xid(code).severity is Severity.APPLICATION


def test_unlisted_codes_are_recoverable_and_say_so() -> None:
    info = classify_xid(999)
    assert (info.code, info.name, info.severity) == (999, "unclassified", Severity.RECOVERABLE)
    assert 999 not in XIDS


def test_recovery_actions() -> None:
    assert classify_recovery_action(0) == ("none", Severity.INFO)
    assert classify_recovery_action(1) == ("GPU reset required", Severity.FATAL)
    assert classify_recovery_action(2) == ("node reboot required", Severity.FATAL)
    assert classify_recovery_action(3)[1] is Severity.RECOVERABLE
    assert classify_recovery_action(4)[1] is Severity.FATAL
    assert classify_recovery_action(7) == ("unknown recovery action 7", Severity.FATAL)


@pytest.mark.parametrize(
    ("event", "verdict"),
    [
        (
            GpuEvent(EventKind.XID, 79),
            Verdict(Severity.FATAL, "Xid 79 (GPU has fallen off the bus)"),
        ),
        (
            GpuEvent(EventKind.XID, 13),
            Verdict(Severity.APPLICATION, "Xid 13 (graphics engine exception)"),
        ),
        (
            GpuEvent(EventKind.SINGLE_BIT_ECC),
            Verdict(Severity.RECOVERABLE, "single-bit ECC error (corrected)"),
        ),
        (
            GpuEvent(EventKind.DOUBLE_BIT_ECC),
            Verdict(Severity.FATAL, "double-bit ECC error (uncorrectable)"),
        ),
        (GpuEvent(EventKind.PSTATE, 2), Verdict(Severity.INFO, "P-state changed to P2")),
        (GpuEvent(EventKind.GPU_UNAVAILABLE), Verdict(Severity.FATAL, "GPU unavailable")),
        (
            GpuEvent(EventKind.GPU_LOST),
            Verdict(Severity.FATAL, "GPU is lost (NVML_ERROR_GPU_IS_LOST)"),
        ),
        (
            GpuEvent(EventKind.RECOVERY_ACTION, 1),
            Verdict(Severity.FATAL, "GPU recovery action 1 (GPU reset required)"),
        ),
        (
            GpuEvent(EventKind.RECOVERY_ACTION, 0),
            Verdict(Severity.INFO, "GPU recovery action 0 (none)"),
        ),
    ],
)
def test_classify_event(event: GpuEvent, verdict: Verdict) -> None:
    assert classify_event(event) == verdict


def test_only_xid_events_carry_an_xid() -> None:
    assert GpuEvent(EventKind.XID, 48).xid == 48
    assert GpuEvent(EventKind.PSTATE, 48).xid is None
