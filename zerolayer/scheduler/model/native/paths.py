"""Which instruction set each native kernel runs on this CPU, as the scheduler logs it once and the
benchmarks record it beside their figures.

The library picks each kernel's path at load time (``cpu_has`` in ``csrc/cpu_features.h``), capped
by the variant it was built as (``$ZEROLAYER_CPU_ISA``: ``native``, ``avx2`` or ``portable``). A
path is a *fallback* when it is the portable loop while the CPU and the cap allow a vector level:
an int8 group size that no vector kernel takes, or a build without vector paths at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerolayer.scheduler.model.native.library import NativeKernels

PORTABLE = "portable"
"""The name of every kernel's plain C++ path (vectorized by the compiler for the build's target)."""
TORCH = "torch"
"""The bfloat16 GEMM's entry where the scheduler multiplies with torch's matmul instead."""


@dataclass(frozen=True)
class KernelPaths:
    """The path of each kernel family, by name (``avx512bf16``, ``avx512vnni``, ``avx2``,
    ``portable``, ...)."""

    isa_level: str
    """The best level the kernels run here under the cap: ``avx512``, ``avx2`` or ``portable``."""
    isa_cap: str
    """The build's cap: ``native``, ``avx2`` or ``portable``."""
    bf16_gemv: str
    """The bfloat16 decode GEMV (up to ``max_skinny_rows`` rows; also the fused decode step's)."""
    bf16_gemm: str
    """More rows of bfloat16: the native GEMM's path, or :data:`TORCH`."""
    attention: str
    """Paged attention."""
    int8_gemv: str | None
    """The int8 decode GEMV for the model's group size; None for a model without int8 weights."""
    int8_group_size: int | None
    """That group size."""

    @classmethod
    def of(cls, module: NativeKernels, int8_group_size: int | None = None) -> KernelPaths:
        """The paths of the loaded ``module`` (for a model with int8 weights of
        ``int8_group_size``, or none)."""
        return cls(
            module.isa_level,
            module.isa_cap,
            module.skinny_linear_isa,
            module.bf16_gemm_isa or TORCH,
            module.paged_attention_isa,
            None if int8_group_size is None else module.int8_linear_isa(int8_group_size),
            int8_group_size,
        )

    def as_dict(self) -> dict[str, str | int | None]:
        """The fields by name, for a results file."""
        return dict(self.__dict__)

    def describe(self) -> str:
        """One line: ``ISA avx2 (build cap avx2): bf16 GEMV avx2, bf16 GEMM avx2, ...``; the
        elementwise steps and the fused decode step's own loops follow the level (compiled
        per level by the compiler)."""
        parts = [
            f"bf16 GEMV {self.bf16_gemv}",
            f"bf16 GEMM {self.bf16_gemm}",
            f"attention {self.attention}",
        ]
        if self.int8_gemv is not None:
            parts.append(f"int8 GEMV {self.int8_gemv} (group size {self.int8_group_size})")
        parts.append(f"elementwise {self.isa_level}")
        return f"ISA {self.isa_level} (build cap {self.isa_cap}): " + ", ".join(parts)

    def fallbacks(self) -> list[str]:
        """One sentence per kernel that runs portable code although this CPU and the build's cap
        have a vector level (empty where none does); where the level itself is portable, one
        sentence saying so."""
        if self.isa_level == PORTABLE:
            return [
                f"the native kernels run their portable loops (build cap {self.isa_cap}): "
                "slower than their AVX2 and AVX-512 paths"
            ]
        out = [
            f"the {name} runs its portable loop on this CPU"
            for name, path in (("bf16 GEMV", self.bf16_gemv), ("attention", self.attention))
            if path == PORTABLE
        ]
        if self.int8_gemv == PORTABLE:
            out.append(
                f"the int8 GEMV runs its portable loop: group size {self.int8_group_size} is no "
                "multiple of 32, which its vector paths need"
            )
        return out
