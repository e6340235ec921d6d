"""The CPU and forced ISA every benchmark figure is recorded with (zerolayer/bench/cpu_isa.py)."""

from __future__ import annotations

import pytest

from zerolayer.bench.cpu_isa import TORCH_AVX2_ENV, cpu_facts, cpu_line, emulate_cpu_isa


def test_forcing_avx2_caps_torch_onednn_and_mkl_unless_the_user_set_them() -> None:
    environ = {"ZEROLAYER_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    assert emulate_cpu_isa(environ) == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    }
    assert environ == {
        "ZEROLAYER_CPU_ISA": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",  # the user's own
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    }


@pytest.mark.parametrize("value", [None, "native", "portable"])
def test_other_runs_change_nothing(value: str | None) -> None:
    environ = {} if value is None else {"ZEROLAYER_CPU_ISA": value}
    assert emulate_cpu_isa(environ) == {}
    assert environ == ({} if value is None else {"ZEROLAYER_CPU_ISA": value})


def test_the_line_names_the_cpu_its_extensions_and_the_levels() -> None:
    machine = {
        "cpu": "AMD EPYC",
        "vector_extensions": ["avx2", "fma", "avx512f"],
        "forced_isa": "avx2",
        "torch_cpu_capability": "AVX2",
        "native_kernels": {"isa_level": "avx2"},
    }
    assert cpu_line(machine) == (
        "AMD EPYC (avx2 fma avx512f); forced ISA avx2: zerolayer's kernels avx2, torch AVX2"
    )
    unavailable = {**machine, "native_kernels": "unavailable: disabled", "vector_extensions": []}
    assert cpu_line(unavailable) == (
        "AMD EPYC (none listed); forced ISA avx2: zerolayer's kernels unavailable, torch AVX2"
    )


def test_the_facts_are_this_machine_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROLAYER_CPU_ISA", raising=False)
    for name in TORCH_AVX2_ENV:
        monkeypatch.delenv(name, raising=False)
    facts = cpu_facts()
    flags = set(open("/proc/cpuinfo").read().split())
    assert all(name in flags for name in facts["vector_extensions"])
    assert ("avx2" in flags) == ("avx2" in facts["vector_extensions"])
    assert facts["forced_isa"] == "native"
    assert facts["isa_environment"] == {}
    assert facts["native_kernels"]["isa_cap"] == "native"
