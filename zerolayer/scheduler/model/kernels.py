"""Native CPU kernels from ``csrc/``, compiled on first use, with the pure-torch path as fallback.

A :class:`KernelLoader` builds ``csrc/*.cpp`` (paged attention, the decode GEMV, the
batch-invariant linear) with torch's C++ extension tooling (ninja and the host C++ compiler) into
a per-user cache, once per machine and torch version, and loads it. When the toolchain or the
source is missing or the build fails it logs why, once, and answers None, so callers use the
reference in :mod:`zerolayer.scheduler.model.attention` and ``F.linear``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import torch

from zerolayer.scheduler.model.int8_linear import Int8Weight, int8_linear_chunked

log = logging.getLogger(__name__)

CSRC_DIR = Path(__file__).resolve().parents[3] / "csrc"
PAGED_ATTENTION_SOURCE = CSRC_DIR / "paged_attention.cpp"
SKINNY_LINEAR_SOURCE = CSRC_DIR / "skinny_linear.cpp"
INVARIANT_LINEAR_SOURCE = CSRC_DIR / "invariant_linear.cpp"
INT8_LINEAR_SOURCE = CSRC_DIR / "int8_linear.cpp"
ELEMENTWISE_SOURCE = CSRC_DIR / "elementwise.cpp"
DECODE_FORWARD_SOURCE = CSRC_DIR / "decode_forward.cpp"
SOURCES = (
    PAGED_ATTENTION_SOURCE,
    SKINNY_LINEAR_SOURCE,
    INVARIANT_LINEAR_SOURCE,
    INT8_LINEAR_SOURCE,
    ELEMENTWISE_SOURCE,
    DECODE_FORWARD_SOURCE,
)
EXTENSION_NAME = "zerolayer_paged_attention"
# NOTE: no -march: the source multiversions its hot functions (target_clones), so a cached build
# stays valid if the cache moves to another CPU. -ffp-contract=fast lets vector a * b + c be an FMA.
# -fopenmp: at::parallel_for is inline and runs serially unless compiled with OpenMP; the library
# then shares torch's libgomp (same soname, already loaded) and its thread count.
EXTRA_CFLAGS = ("-O3", "-ffp-contract=fast", "-fopenmp")
EXTRA_LDFLAGS = ("-fopenmp",)
NATIVE_DTYPES = frozenset({torch.float32, torch.bfloat16})
"""Dtypes of q and the caches the native kernel handles."""


def build_key(csrc_dir: Path, torch_dir: Path) -> str:
    """A short hash (12 hex digits, SHA-256) of what a build's command line and inputs depend
    on: the ``csrc`` directory's path and the contents of its sources and headers, torch's
    install path (its headers and libraries) and the compiler flags.

    Two checkouts or virtual environments sharing one kernel cache then build into different
    directories, each once, instead of rebuilding each other's library on every start (ninja
    rebuilds when the command line changes, and it names both paths).
    """
    digest = hashlib.sha256()
    for part in (str(csrc_dir), str(torch_dir), *EXTRA_CFLAGS, *EXTRA_LDFLAGS):
        digest.update(part.encode() + b"\0")
    for path in sorted([*csrc_dir.glob("*.cpp"), *csrc_dir.glob("*.h")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def default_build_dir() -> Path:
    """``$ZEROLAYER_KERNEL_CACHE`` or ``~/.cache/zerolayer/torch_extensions``, then
    ``<torch>-<python>-<build_key>`` (read when called, not at import).

    Not under ``$XDG_CACHE_HOME``: tests and benchmarks give each stack its own model cache, and
    should not rebuild the kernel (about a minute) for each. The torch and Python versions are part
    of the path since the library links against both; :func:`build_key` since the build's
    command line names the checkout and the venv.
    """
    override = os.environ.get("ZEROLAYER_KERNEL_CACHE")
    key = build_key(CSRC_DIR, Path(torch.__file__).parent)
    tag = f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}-{key}"
    if override:
        return Path(override) / tag
    cache = str(Path.home() / ".cache")
    return Path(cache) / "zerolayer" / "torch_extensions" / tag


def is_built(build_dir: Path, inputs: tuple[Path, ...] | None = None) -> bool:
    """Whether ``build_dir`` holds the library, newer than each of ``inputs`` (default: the
    sources and the headers of ``csrc/``): loading it then only links it. ninja decides the same
    way (and also rebuilds for changed flags); this only words the log line.
    """
    inputs = inputs if inputs is not None else (*SOURCES, *sorted(CSRC_DIR.glob("*.h")))
    try:
        built = (build_dir / f"{EXTENSION_NAME}.so").stat().st_mtime_ns
        return all(path.stat().st_mtime_ns <= built for path in inputs)
    except FileNotFoundError:
        return False


class KernelLoader:
    """Builds and loads the native kernels on first use; one per model runner.

    Thread-safe: concurrent first calls build once. Across processes, an flock on the build
    directory serialises builds (a cached build only loads, in well under a second).
    """

    def __init__(
        self,
        build_dir: Path | None = None,
        *,
        enabled: bool = True,
        batch_invariant: bool = False,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        """
        Args:
            build_dir: where the extension is compiled and cached; default
                :func:`default_build_dir` (resolved on first use).
            enabled: False: never build, always answer None (the reference path).
            batch_invariant: :meth:`linear` runs every CPU bfloat16/float32 product through
                the batch-invariant kernel (``csrc/invariant_linear.cpp``), whatever the rows.
            which: looks a program up on PATH (``shutil.which``); tests pass one that finds
                nothing to act out a machine without a toolchain.
        """
        self._build_dir = build_dir
        self._enabled = enabled
        self.batch_invariant = batch_invariant
        """Whether :meth:`linear` is batch invariant (when the kernels load)."""
        self._which = which
        self._lock = threading.Lock()
        self._loaded = False
        self._module: ModuleType | None = None
        self.unavailable_reason: str | None = None
        """Why :meth:`load` answered None (after it did); None while the kernels are usable."""

    def load(self) -> ModuleType | None:
        """The compiled extension, building it the first time (tens of seconds); None if unusable.

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

    def linear(self, x: torch.Tensor, weight: torch.Tensor | Int8Weight) -> torch.Tensor:
        """``F.linear(x, weight)``, through a native kernel when one applies.

        An :class:`Int8Weight` goes to :meth:`int8_linear`.

        With :attr:`batch_invariant`, CPU ``x`` [M, K] and ``weight`` [N, K] of the same dtype,
        bfloat16 or float32, go to ``csrc/invariant_linear.cpp``: any M and K, float32
        accumulation in a fixed order per output, so row m of the result depends only on row m
        of ``x`` and on ``weight`` (not on M, the other rows or the thread count).

        Otherwise the bfloat16 GEMV (``csrc/skinny_linear.cpp``) takes bfloat16 ``x`` with M at
        most the module's ``max_skinny_rows`` (batch-1 and small-batch decode, where a step is
        bound by reading the weights), K a multiple of 16 and a contiguous ``weight``; it
        accumulates in float32 like torch's kernel. Anything else, or no native module, goes to
        ``F.linear``.

        Returns:
            [M, N] in the dtype of ``x``.
        """
        if isinstance(weight, Int8Weight):
            return self.int8_linear(x, weight)
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
        if (
            module is not None
            and not x.is_cuda
            and not weight.is_cuda
            and x.dtype == torch.bfloat16
            and weight.dtype == torch.bfloat16
            and x.dim() == 2
            and x.shape[0] <= module.max_skinny_rows
            and x.shape[1] % 16 == 0
            and weight.is_contiguous()
        ):
            return module.skinny_linear(x, weight)
        return torch.nn.functional.linear(x, weight)

    def int8_linear(self, x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
        """``x`` [M, K] times an int8 weight's transpose (a ``zerolayer quantize`` checkpoint).

        CPU bfloat16 or float32 ``x`` with M at most ``max_skinny_rows`` (decode) goes to
        ``csrc/int8_linear.cpp`` (x quantized per group to int8, VNNI int32 group sums where the
        CPU has them); anything else, or no native module, to
        :func:`~zerolayer.scheduler.model.int8_linear.int8_linear_chunked` (a block of weight
        rows dequantized at a time, then matmul). With :attr:`batch_invariant`, every CPU call
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
        return int8_linear_chunked(x, weight)

    def linears(
        self, x: torch.Tensor, weights: Sequence[torch.Tensor | Int8Weight]
    ) -> list[torch.Tensor]:
        """``[F.linear(x, w) for w in weights]``, as :meth:`linear` computes each, in one native
        call when the bfloat16 GEMV applies to every weight (q, k and v, or gate and up, of a
        decode step): one parallel region over their rows instead of one each, and the weights
        read in place (no concatenated copy). Likewise int8 weights where :meth:`int8_linear`
        takes the native kernel for each (``int8_linear_multi``, which also quantizes x once);
        other mixes go one by one to :meth:`linear`.

        Returns:
            One [M, N_i] tensor per weight, in the dtype of ``x``; the same values as
            :meth:`linear` gives for each weight.
        """
        module = self._module if self._loaded else self.load()
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
            and not x.is_cuda
            and x.dtype == torch.bfloat16
            and x.dim() == 2
            and x.shape[0] <= module.max_skinny_rows
            and x.shape[1] % 16 == 0
            and all(
                isinstance(w, torch.Tensor)
                and w.dtype == torch.bfloat16
                and not w.is_cuda
                and w.is_contiguous()
                for w in weights
            )
        ):
            return module.skinny_linear_multi(x, list(weights))
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

    def _build(self) -> tuple[ModuleType | None, str | None]:
        if not self._enabled:
            return None, "disabled"
        for source in SOURCES:
            if not source.is_file():
                return None, f"{source} not found"
        compiler = os.environ.get("CXX", "c++")
        if self._which(compiler) is None:
            return None, f"no C++ compiler ({compiler!r}) on PATH"
        ninja_dir = self._ninja_dir()
        if ninja_dir is None:
            return None, "ninja not found (pip install ninja)"
        build_dir = self._build_dir or default_build_dir()
        if is_built(build_dir):
            log.info("loading the native kernels from %s", build_dir)
            if self._build_dir is None:
                # NOTE: the default directory is keyed by the sources, paths and flags
                # (build_key), so a library there is this build's: loaded as it is, without
                # cpp_extension (which imports setuptools and runs the compiler and ninja to
                # check it, about 0.3 s of every scheduler start). One that does not load is
                # built again below.
                with contextlib.suppress(ImportError), _build_lock(build_dir):
                    return import_library(build_dir), None
        else:
            log.info(
                "building the native kernels in %s (about a minute on 2 cores, once)", build_dir
            )
        try:
            from torch.utils import cpp_extension

            build_dir.mkdir(parents=True, exist_ok=True)
            with _build_lock(build_dir), _path_with(ninja_dir):
                module = cpp_extension.load(
                    name=EXTENSION_NAME,
                    sources=[str(source) for source in SOURCES],
                    extra_include_paths=[str(CSRC_DIR)],
                    build_directory=str(build_dir),
                    extra_cflags=list(EXTRA_CFLAGS),
                    extra_ldflags=list(EXTRA_LDFLAGS),
                    verbose=False,
                )
        except Exception as e:  # any build failure means the fallback
            return None, f"build failed: {type(e).__name__}: {str(e).strip()[-2000:]}"
        return module, None

    def _ninja_dir(self) -> Path | None:
        """Directory of ``ninja``: on PATH, else beside this interpreter (a venv not activated)."""
        found = self._which("ninja")
        if found is not None:
            return Path(found).parent
        beside = Path(sys.executable).parent
        if self._which(str(beside / "ninja")) is not None:
            return beside
        return None


def import_library(build_dir: Path) -> ModuleType:
    """Imports the extension built in ``build_dir`` (``zerolayer_paged_attention.so``), as
    ``torch.utils.cpp_extension.load`` does once its build is up to date.

    Raises:
        ImportError: the library is missing or cannot be loaded.
    """
    path = build_dir / f"{EXTENSION_NAME}.so"
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """Holds an flock on ``build_dir`` for one build or load across processes.

    torch's own lock is a plain file that a build killed midway leaves behind, and every later
    build then waits on it forever. An flock dies with its process, so while holding it any
    torch lock file left in ``build_dir`` is stale and is removed.
    """
    with open(build_dir / "zerolayer.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                log.warning("removing stale build lock %s", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _path_with(directory: Path) -> Iterator[None]:
    """Puts ``directory`` first on PATH while building (cpp_extension runs ``ninja`` by name)."""
    old = os.environ.get("PATH", "")
    if str(directory) in old.split(os.pathsep):
        yield
        return
    os.environ["PATH"] = os.pathsep.join([str(directory), old])
    try:
        yield
    finally:
        os.environ["PATH"] = old


def main() -> None:
    """``python -m zerolayer.scheduler.model.kernels``: builds the kernels ahead of time (CI,
    images).

    Exits 1, with the reason, when they cannot be built.
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    loader = KernelLoader()
    if not loader.native_available():
        raise SystemExit(f"native kernels unavailable: {loader.unavailable_reason}")
    print(f"native kernels ready in {default_build_dir()}")


if __name__ == "__main__":
    main()
