"""What the scheduler logs about the native kernels' instruction sets (native/paths.py)."""

from __future__ import annotations

from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.native.paths import KernelPaths


def make_paths(**overrides: object) -> KernelPaths:
    fields = {
        "isa_level": "avx2",
        "isa_cap": "avx2",
        "bf16_gemv": "avx2",
        "bf16_gemm": "avx2",
        "attention": "avx2",
        "int8_gemv": None,
        "int8_group_size": None,
        **overrides,
    }
    return KernelPaths(**fields)  # type: ignore[arg-type]


def test_one_line_names_the_level_the_cap_and_every_path() -> None:
    assert make_paths().describe() == (
        "ISA avx2 (build cap avx2): bf16 GEMV avx2, bf16 GEMM avx2, attention avx2, "
        "elementwise avx2"
    )
    described = make_paths(
        isa_level="avx512",
        isa_cap="native",
        bf16_gemv="avx512bf16",
        bf16_gemm="torch",
        attention="avx512",
        int8_gemv="avx512vnni",
        int8_group_size=32,
    ).describe()
    assert described == (
        "ISA avx512 (build cap native): bf16 GEMV avx512bf16, bf16 GEMM torch, attention avx512, "
        "int8 GEMV avx512vnni (group size 32), elementwise avx512"
    )


def test_fallbacks_are_the_portable_loops_where_a_vector_level_is_there() -> None:
    assert make_paths().fallbacks() == []
    assert make_paths(int8_gemv="portable", int8_group_size=16).fallbacks() == [
        "the int8 GEMV runs its portable loop: group size 16 is no multiple of 32, which its "
        "vector paths need"
    ]
    portable = make_paths(
        isa_level="portable", isa_cap="portable", bf16_gemv="portable", attention="portable"
    )
    assert portable.fallbacks() == [
        "the native kernels run their portable loops (build cap portable): slower than their "
        "AVX2 and AVX-512 paths"
    ]


def test_the_paths_are_the_loaded_library_s(native: KernelLoader) -> None:
    module = native.load()
    paths = KernelPaths.of(module, int8_group_size=16)
    assert paths == KernelPaths(
        module.isa_level,
        module.isa_cap,
        module.skinny_linear_isa,
        module.bf16_gemm_isa or "torch",
        module.paged_attention_isa,
        "portable",
        16,
    )
    assert paths.as_dict()["int8_gemv"] == "portable"
    assert KernelPaths.of(module).int8_gemv is None
