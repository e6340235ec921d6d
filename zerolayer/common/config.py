"""Frozen per-layer configs, built once at the process edge (CLI / ``__main__``)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_BLOCK_SIZE = 16
DEFAULT_KV_CACHE_BYTES = 512 * 1024 * 1024

WARM_UP_PROMPT_TOKENS = 32
"""Prompt length of the request the scheduler runs before it reports SERVING."""
WARM_UP_MAX_NEW_TOKENS = 2
"""Tokens that warm-up request generates (one prefill step, one decode step)."""


def warm_up_num_blocks(block_size: int, max_model_len: int) -> int:
    """KV blocks the scheduler's warm-up request needs, by ``Scheduler.add_request``'s rule:
    prompt plus new tokens, capped at the context length, less the last generated token (its KV
    is never stored), in whole blocks. The smallest arena a stack can start with."""
    num_kv_tokens = min(WARM_UP_PROMPT_TOKENS + WARM_UP_MAX_NEW_TOKENS, max_model_len) - 1
    return -(-num_kv_tokens // block_size)


@dataclass(frozen=True)
class LoaderConfig:
    """Loader process settings."""

    address: str
    """gRPC address to serve on, e.g. ``unix:/run/zl/loader.sock``."""
    model_dir: str
    """Hugging Face model directory (config.json, *.safetensors, tokenizer.json)."""
    model_name: str = ""
    """Name to serve the model under; empty: the directory's base name."""
    prefetch: bool = True
    """Start kernel read-ahead of the weight files at start-up."""
    device: str = "cpu"
    """``--device``: "cpu", "cuda", "cuda:N" or "auto" (see zerolayer.common.device)."""
    fd_keeper: str = ""
    """Unix socket of the launcher's descriptor keeper (``--fd-keeper``; set by ``zerolayer up``):
    on a GPU, device memory deposited there survives this layer's restarts."""
    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0: off."""
    metrics_host: str = "127.0.0.1"
    """Address the /metrics endpoint binds."""


@dataclass(frozen=True)
class KVStoreConfig:
    """KV store process settings."""

    address: str
    """gRPC address to serve on."""
    loader_address: str
    """Where the loader serves (the arena's geometry comes from the model config)."""
    shm_path: str
    """Shared-memory file of the arena, e.g. ``/dev/shm/zerolayer-<id>.kv``."""
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
    """Arena size in bytes; the number of blocks is kv_cache_bytes // block_bytes."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Tokens per KV block."""
    enable_prefix_caching: bool = True
    """Find full blocks again by content and reuse them across requests."""
    remove_arena_on_exit: bool = False
    """Delete the arena file on a clean exit (off: the arena outlives the process, so a restarted
    kvstore reopens it; the launcher removes it when the whole stack stops)."""
    device: str = "cpu"
    """``--device``: "cpu", "cuda", "cuda:N" or "auto" (see zerolayer.common.device)."""
    fd_keeper: str = ""
    """Unix socket of the launcher's descriptor keeper (``--fd-keeper``; set by ``zerolayer up``):
    on a GPU, device memory deposited there survives this layer's restarts."""
    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0: off."""
    metrics_host: str = "127.0.0.1"
    """Address the /metrics endpoint binds."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler (engine) process settings."""

    address: str
    """gRPC address to serve on."""
    loader_address: str
    """Where the loader serves."""
    kvstore_address: str
    """Where the kvstore serves."""
    max_num_seqs: int = 64
    """Most requests in the running set."""
    max_num_batched_tokens: int = 512
    """Token budget of one step (prefill chunks plus decodes)."""
    num_threads: int = 0
    """torch intra-op threads; 0: :func:`default_num_threads` (one per available core but one)."""
    kv_unavailable_timeout_s: float = 30.0
    """Seconds requests that need KV blocks wait for an unusable kvstore before they end with
    UNAVAILABLE."""
    attention_backend: str = "native"
    """"native" (the csrc kernel, built on first start; falls back to "reference" when it cannot
    be built) or "reference" (pure torch)."""
    device: str = "cpu"
    """``--device``: "cpu", "cuda", "cuda:N" or "auto" (see zerolayer.common.device)."""
    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0: off."""
    metrics_host: str = "127.0.0.1"
    """Address the /metrics endpoint binds."""
    nvml_script: str = ""
    """Test only (hidden ``--nvml-script``): read GPU events and samples from this JSON-lines file
    (zerolayer.scheduler.gpu_health.script) instead of NVML; empty: NVML where a GPU exists."""


@dataclass(frozen=True)
class FrontendConfig:
    """Frontend process settings."""

    listen: str
    """Public gRPC address, ``HOST:PORT``."""
    loader_address: str
    """Where the loader serves (tokenizer, model info)."""
    scheduler_address: str
    """Where the scheduler serves."""
    default_max_new_tokens: int = 64
    """max_new_tokens when a request leaves it 0."""
    max_stop_strings: int = 16
    """Most stop strings per request."""
    max_cache_salt_bytes: int = 256
    """Longest cache_salt accepted."""
    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0: off."""
    metrics_host: str = "127.0.0.1"
    """Address the /metrics endpoint binds."""
    instance_id: str = ""
    """Extra health name ``zerolayer.instance.<id>`` (lets a launcher recognise its own frontend
    on a TCP port another process might hold)."""


def default_num_threads(num_cores: int) -> int:
    """The scheduler's torch threads when none are asked for: every core but one, at least 1.

    The spare core is for the layers beside the engine (frontend, kvstore, gRPC, tokenization):
    OpenMP's barriers wait for the slowest thread, so when any other busy process preempts one
    of as many threads as cores, every parallel region of the forward waits a scheduler time
    slice. Measured on 2 cores with one busy process beside the stack: batch-1 decode 1.9
    tok/s with 2 threads, 55.6 with 1 (docs/benchmarks.md, "split"). vLLM's CPU backend
    reserves a core for its frontend the same way (``VLLM_CPU_NUM_OF_RESERVED_CPU``).
    """
    return max(1, num_cores - 1)
