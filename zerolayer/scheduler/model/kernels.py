"""Native CPU kernels from ``csrc/``, with the pure-torch path as fallback.

A :class:`KernelLoader` loads ``libzerolayer_kernels.so`` (paged attention, the decode GEMVs, the
batch-invariant linear, the elementwise steps, the fused decode step) with ctypes
(:class:`~zerolayer.scheduler.model.native.library.NativeKernels`): the library ``pip install``
built into the package when it still matches the sources, else the one in the per-user cache,
else it builds that one first (seconds; :mod:`zerolayer.scheduler.model.native.build`, which
``zerolayer up`` runs before it starts the layers). When there is no compiler or the build fails
it logs why, once, and answers None, so callers use the reference in
:mod:`zerolayer.scheduler.model.attention` and ``F.linear``.

``$ZEROLAYER_CPU_ISA`` (``native``, ``avx2``, ``portable``; read when the kernels are loaded,
never at import) picks the library's variant: ``avx2`` and ``portable`` are built with flags that
cap every kernel at that level whatever the CPU (``build.ISA_VARIANTS``), so an AVX-512 machine
measures and tests the paths an AVX2-only one runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from zerolayer.scheduler.model.gguf.linear import quant_linear_chunked
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.int8_linear import Int8Weight, int8_linear_chunked
from zerolayer.scheduler.model.native import build
from zerolayer.scheduler.model.native.library import NativeKernels
from zerolayer.scheduler.model.native.paths import KernelPaths

log = logging.getLogger(__name__)

CSRC_DIR = build.CSRC_DIR
NATIVE_DTYPES = frozenset({torch.float32, torch.bfloat16})
"""Dtypes of q and the caches the native kernel handles."""
GGUF_KERNEL_MAX_ROWS = {torch.bfloat16: 32, torch.float32: 4}
"""Most rows of x, by x's dtype, a GGUF weight's product takes the native kernel for; more rows
dequantize blocks of weight rows and call torch's matmul (measured: docs/benchmarks.md, "GGUF
kernels": bfloat16's integer kernel wins up to 32 rows, float32's dequantizing one only for
decode). Where torch has no fast bfloat16 matmul (:func:`torch_bf16_matmul_is_fast`), bfloat16
x takes the native kernel at any M."""


def torch_bf16_matmul_is_fast() -> bool:
    """Whether torch's CPU bfloat16 matmul runs oneDNN's bfloat16 kernels (AVX-512, AMX) rather
    than a float32 emulation: with torch held to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``) it took 4x
    the native GGUF kernel's time at 512 rows (docs/benchmarks.md, "GGUF kernels")."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a private op of torch's: absent, not supported
        return False


class KernelLoader:
    """Loads the native kernels on first use (building them first where needed); one per model
    runner.

    Thread-safe: concurrent first calls build once. Across processes, the build program holds an
    flock on its output directory: a build another process started is waited for.
    """

    def __init__(
        self,
        build_dir: Path | None = None,
        *,
        enabled: bool = True,
        batch_invariant: bool = False,
        isa: str | None = None,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        """
        Args:
            build_dir: build and load the library here only; None: the one ``pip install``
                built into the package if it matches the sources, else the per-user cache's
                (:func:`~zerolayer.scheduler.model.native.build.cache_dir`).
            enabled: False: never build, always answer None (the reference path).
            batch_invariant: :meth:`linear` runs every CPU bfloat16/float32 product through
                the batch-invariant kernel (``csrc/invariant_linear.cpp``), whatever the rows.
            isa: the library's variant (``native``, ``avx2``, ``portable``); None:
                ``$ZEROLAYER_CPU_ISA``'s, read by :meth:`load` (``native`` when unset).
            which: looks a program up on PATH (``shutil.which``); tests pass one that finds
                nothing to act out a machine without a toolchain.
        """
        self._build_dir = build_dir
        self._enabled = enabled
        self.batch_invariant = batch_invariant
        """Whether :meth:`linear` is batch invariant (when the kernels load)."""
        self._which = which
        self.gguf_max_rows = dict(GGUF_KERNEL_MAX_ROWS)
        """Most rows of x per dtype the GGUF weights' products take the native kernel for."""
        if not torch_bf16_matmul_is_fast():
            self.gguf_max_rows[torch.bfloat16] = sys.maxsize
        self._isa = isa
        self._lock = threading.Lock()
        self._loaded = False
        self._module: NativeKernels | None = None
        self._missing_reason = ""
        self.unavailable_reason: str | None = None
        """Why :meth:`load` answered None (after it did); None while the kernels are usable."""

    def load(self) -> NativeKernels | None:
        """The loaded kernels, building them the first time if needed (seconds); None if
        unusable.

        Never raises: a failure is logged once and remembered.
        """
        if self._loaded:
            return self._module
        with self._lock:
            if not self._loaded:
                self._module, self.unavailable_reason = self._build()
                self._loaded = True
                if self._module is None:
                    # NOTE: disabled is what the user asked for (--attention-backend
                    # reference), not a fault worth a warning.
                    log.log(
                        logging.INFO if not self._enabled else logging.WARNING,
                        "native kernels unavailable (%s); using the pure-torch path",
                        self.unavailable_reason,
                    )
        return self._module

    @property
    def loaded(self) -> bool:
        """Whether :meth:`load` ran and gave the kernels (asking builds nothing)."""
        return self._loaded and self._module is not None

    def native_available(self) -> bool:
        """Whether the native kernels are usable (builds them on the first call)."""
        return self.load() is not None

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor | Int8Weight | QuantWeight
    ) -> torch.Tensor:
        """``F.linear(x, weight)``, through a native kernel when one applies.

        An :class:`Int8Weight` goes to :meth:`int8_linear`, a :class:`QuantWeight` to
        :meth:`quant_linear`.

        With :attr:`batch_invariant`, CPU ``x`` [M, K] and ``weight`` [N, K] of the same dtype,
        bfloat16 or float32, go to ``csrc/invariant_linear.cpp``: any M and K, float32
        accumulation in a fixed order per output, so row m of the result depends only on row m
        of ``x`` and on ``weight`` (not on M, the other rows or the thread count).

        Otherwise the bfloat16 GEMV (``csrc/skinny_linear.cpp``) takes bfloat16 ``x`` with M at
        most the module's ``max_skinny_rows`` (batch-1 and small-batch decode, where a step is
        bound by reading the weights), K a multiple of 16 and a contiguous ``weight``; it
        accumulates in float32 like torch's kernel. More rows of bfloat16 go to
        ``csrc/bf16_gemm.cpp`` where the CPU lacks AVX-512 BF16 (the module's ``bf16_gemm_isa``:
        torch's bfloat16 matmul then runs a slow fallback), with the same conditions on K and the
        weight. Anything else, or no native module, goes to ``F.linear``.

        Returns:
            [M, N] in the dtype of ``x``.
        """
        if isinstance(weight, Int8Weight):
            return self.int8_linear(x, weight)
        if isinstance(weight, QuantWeight):
            return self.quant_linear(x, weight)
        module = self._module if self._loaded else self.load()
        if (
            self.batch_invariant
            and module is not None
            and not x.is_cuda
            and not weight.is_cuda
            and x.dim() == 2
            and x.dtype == weight.dtype
            and x.dtype in NATIVE_DTYPES
        ):
            return module.invariant_linear(x, weight)
        if module is not None and (
            (y := module.try_skinny_linear(x, weight)) is not None
            or (y := module.try_bf16_gemm(x, weight)) is not None
        ):
            return y
        return torch.nn.functional.linear(x, weight)

    def int8_linear(self, x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
        """``x`` [M, K] times an int8 weight's transpose (a ``zerolayer quantize`` checkpoint).

        CPU bfloat16 or float32 ``x`` with M at most ``max_skinny_rows`` (decode) goes to
        ``csrc/int8_linear.cpp`` (x quantized per group to int8, VNNI int32 group sums where the
        CPU has them, else AVX2's vpmaddubsw); anything else, or no native module, to
        :func:`~zerolayer.scheduler.model.int8_linear.int8_linear_chunked` (a block of weight
        rows dequantized at a time, then multiplied as :meth:`linear` multiplies a dense
        weight). With :attr:`batch_invariant`, every CPU call
        takes the chunks with the batch-invariant kernel for the matmul (any M: a row's result
        then does not depend on M, which the decode kernel's switch at M = 4 would break).

        Returns:
            [M, N] in the dtype of ``x``.
        """
        module = self._module if self._loaded else self.load()
        cpu = not x.is_cuda and weight.device.type != "cuda"
        if self.batch_invariant and module is not None and cpu and x.dtype in NATIVE_DTYPES:
            return int8_linear_chunked(x, weight, module.invariant_linear)
        if (
            module is not None
            and cpu
            and x.dim() == 2
            and x.dtype in NATIVE_DTYPES
            and x.shape[0] <= module.max_skinny_rows
        ):
            return module.int8_linear(x, weight.qweight, weight.scales)
        return int8_linear_chunked(x, weight, self.linear if module is not None else F.linear)

    def quant_linear(self, x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
        """``x`` [M, K] times a GGUF weight's transpose (``csrc/gguf_linear.cpp``).

        CPU bfloat16 or float32 ``x`` with M at most :attr:`gguf_max_rows` of its dtype takes
        the native kernel (bfloat16 x quantized per block with integer block sums, as
        llama.cpp; float32 x against the exactly dequantized weight); more rows dequantize a
        block of weight rows at a time natively and call torch's matmul
        (:func:`~zerolayer.scheduler.model.gguf.linear.quant_linear_chunked`), and so does
        everything without the native module, with the torch dequantization. With
        :attr:`batch_invariant` every CPU call takes the native kernel, whose rows do not
        depend on M or on each other.

        Returns:
            [M, N] in the dtype of ``x``.
        """
        module = self._module if self._loaded else self.load()
        if not self._gguf_native(module, x, [weight]):
            return quant_linear_chunked(x, weight)
        assert module is not None
        if self.batch_invariant or x.shape[0] <= self.gguf_max_rows[x.dtype]:
            return module.gguf_linear(x, weight)
        return quant_linear_chunked(x, weight, module.gguf_dequantize)

    @staticmethod
    def _gguf_native(
        module: NativeKernels | None, x: torch.Tensor, weights: Sequence[object]
    ) -> bool:
        """Whether the native GGUF kernels take x against these weights."""
        return (
            module is not None
            and not x.is_cuda
            and x.dim() == 2
            and x.dtype in NATIVE_DTYPES
            and all(isinstance(w, QuantWeight) and w.device.type == "cpu" for w in weights)
        )

    def linears(
        self, x: torch.Tensor, weights: Sequence[torch.Tensor | Int8Weight | QuantWeight]
    ) -> list[torch.Tensor]:
        """``[F.linear(x, w) for w in weights]``, as :meth:`linear` computes each, in one native
        call when the bfloat16 GEMV applies to every weight (q, k and v, or gate and up, of a
        decode step): one parallel region over their rows instead of one each, and the weights
        read in place (no concatenated copy). Likewise int8 weights where :meth:`int8_linear`
        takes the native kernel for each (``int8_linear_multi``, which also quantizes x once),
        and GGUF weights of any types where :meth:`quant_linear` does (``gguf_linear_multi``);
        other mixes go one by one to :meth:`linear`.

        Returns:
            One [M, N_i] tensor per weight, in the dtype of ``x``; the same values as
            :meth:`linear` gives for each weight.
        """
        module = self._module if self._loaded else self.load()
        if (
            len(weights) > 1
            and self._gguf_native(module, x, weights)
            and (self.batch_invariant or x.shape[0] <= self.gguf_max_rows[x.dtype])
        ):
            assert module is not None
            return module.gguf_linear_multi(x, weights)  # type: ignore[arg-type]
        int8 = [w for w in weights if isinstance(w, Int8Weight)]
        if (
            len(weights) > 1
            and len(int8) == len(weights)
            and module is not None
            and not self.batch_invariant
            and not x.is_cuda
            and x.dim() == 2
            and x.dtype in NATIVE_DTYPES
            and x.shape[0] <= module.max_skinny_rows
            and all(w.device.type != "cuda" and w.group_size == int8[0].group_size for w in int8)
        ):
            return module.int8_linear_multi(x, [(w.qweight, w.scales) for w in int8])
        if (
            len(weights) > 1
            and module is not None
            and not self.batch_invariant
            and not int8
            and not any(isinstance(w, QuantWeight) for w in weights)
            and (ys := module.try_skinny_linear_multi(x, weights)) is not None
        ):
            return ys
        return [self.linear(x, w) for w in weights]

    def paged_attention_native(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Causal grouped-query attention over the paged cache, in ``csrc/paged_attention.cpp``.

        Reads K/V in place through the block tables (K/V of this step already written); does not
        modify the caches. Accumulates in float32 for bfloat16 inputs.

        Args:
            q: [T, Hq, D] float32 or bfloat16, Hq a multiple of Hkv.
            k_cache, v_cache: [num_blocks, block_size, Hkv, D], same dtype as ``q``.
            query_start_loc: int32/int64 [B + 1]: sequence b owns query rows
                ``[query_start_loc[b], query_start_loc[b + 1])``.
            seq_lens: int32/int64 [B]: context length of each sequence after this step; query
                i of sequence b sits at position ``seq_lens[b] - num_queries_b + i`` and sees the
                keys at positions up to its own.
            block_tables: int32/int64 [B, max_blocks], padded rows; the first
                ``ceil(seq_lens[b] / block_size)`` entries of row b are read.
            scale: softmax scale.

        Returns:
            [T, Hq, D] in the dtype of ``q``.

        Raises:
            RuntimeError: the kernels are unavailable, or the inputs are inconsistent (shapes,
                dtypes, a block id outside the cache, a block table too short).
        """
        module = self.load()
        if module is None:
            raise RuntimeError(f"native attention kernel unavailable: {self.unavailable_reason}")
        return module.paged_attention(
            q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale
        )

    def _build(self) -> tuple[NativeKernels | None, str | None]:
        if not self._enabled:
            return None, "disabled"
        try:
            library = self._library()
            if library is None:
                return None, self._missing_reason
            return NativeKernels(library), None
        except (build.BuildError, OSError) as e:  # any failure means the fallback
            return None, f"{type(e).__name__}: {str(e).strip()[-2000:]}"

    def _library(self) -> Path | None:
        """The library of the current sources: the install-time one, the cache's, or a new
        build (None, with :attr:`_missing_reason`, without sources or a compiler).

        Raises:
            build.BuildError: the build failed.
        """
        variant = build.isa_variant({build.ISA_ENV: self._isa} if self._isa else os.environ)
        digest = build.source_digest(CSRC_DIR, variant) if CSRC_DIR.is_dir() else None
        if self._build_dir is None and (digest is not None or variant == build.DEFAULT_ISA):
            library = build.built_library(build.PREBUILT_DIR, digest)
            if library is not None:
                log.info("loading the native kernels from %s", library)
                return library
        if digest is None:
            self._missing_reason = f"{CSRC_DIR} not found"
            if variant != build.DEFAULT_ISA:  # NOTE: the installed library is the native one
                self._missing_reason += f" (the {variant} variant is built from it)"
            return None
        compiler = build.compiler(os.environ)
        if self._which(compiler) is None:
            self._missing_reason = f"no C++ compiler ({compiler!r}) on PATH"
            return None
        out_dir = self._build_dir or build.cache_dir(
            digest, build.compiler_version(compiler), os.environ
        )
        library = build.built_library(out_dir, digest)
        if library is not None:
            log.info("loading the native kernels from %s", library)
            return library
        log.info("building the native kernels (%s) in %s (seconds, once)", variant, out_dir)
        return build.run_build(out_dir, variant=variant)


def main() -> None:
    """``python -m zerolayer.scheduler.model.kernels``: loads the kernels as the scheduler does,
    building them first if needed (``$ZEROLAYER_CPU_ISA``'s variant), and says from where and
    which instruction set each kernel runs (CI, images).

    Exits 1, with the reason, when they are unavailable.
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module = KernelLoader().load()
    if module is None:
        raise SystemExit("native kernels unavailable: see above")
    paths = KernelPaths.of(module)
    print(f"native kernels ready: {module.path}")
    print(f"native kernels: {paths.describe()}")
    for fallback in paths.fallbacks():
        print(f"native kernels: {fallback}")


if __name__ == "__main__":
    main()
