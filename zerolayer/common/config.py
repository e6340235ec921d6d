"""Frozen per-layer configs, built once at the process edge (CLI / ``__main__``) from the flags
of ``zerolayer.common.settings``, whose declarations hold every default."""

from __future__ import annotations

from dataclasses import dataclass

from zerolayer.common import settings

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


# Groups of settings that several configs hold (``StackConfig`` holds every group ``zerolayer
# up`` offers). Their fields are keyword-only, so a config's own required fields may follow.


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    """Where a layer's Prometheus endpoint binds."""

    metrics_host: str = settings.METRICS_HOST.default
    """Address the /metrics endpoint binds (``--metrics-host``)."""


@dataclass(frozen=True, kw_only=True)
class LayerSettings(MetricsSettings):
    """What every layer process has."""

    metrics_port: int = settings.METRICS_PORT.default
    """TCP port of the Prometheus /metrics endpoint; 0: off."""


@dataclass(frozen=True, kw_only=True)
class DeviceSettings:
    """Where the loader, kvstore and scheduler keep their memory and compute."""

    device: str = settings.DEVICE.default
    """``--device``: "cpu", "cuda", "cuda:N" or "auto" (see zerolayer.common.device)."""


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The model the loader serves."""

    model_dir: str
    """Hugging Face model directory (config.json, *.safetensors, tokenizer.json)."""
    model_name: str = settings.MODEL_NAME.default
    """Name to serve the model under; empty: the directory's base name."""
    prefetch: bool = settings.PREFETCH.default
    """Start kernel read-ahead of the weight files at start-up."""


@dataclass(frozen=True, kw_only=True)
class ArenaSettings:
    """The KV arena the kvstore owns."""

    kv_cache_bytes: int = settings.KV_CACHE_BYTES.default
    """Arena size in bytes; the number of blocks is kv_cache_bytes // block_bytes."""
    block_size: int = settings.BLOCK_SIZE.default
    """Tokens per KV block."""
    enable_prefix_caching: bool = settings.PREFIX_CACHING.default
    """Find full blocks again by content and reuse them across requests."""
    owner_lease_s: float = settings.OWNER_LEASE_S.default
    """Lease of each registered scheduler (owner), seconds: without a keep-alive for this long its
    block references are released; also the recovery window after a restart."""


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """How the scheduler batches and runs requests."""

    max_num_seqs: int = settings.MAX_NUM_SEQS.default
    """Most requests in the running set."""
    max_num_batched_tokens: int = settings.MAX_NUM_BATCHED_TOKENS.default
    """Token budget of one step (prefill chunks plus decodes), tokens."""
    num_threads: int = settings.NUM_THREADS.default
    """torch intra-op threads; 0: :func:`default_num_threads` (one per available core)."""
    kv_unavailable_timeout_s: float = settings.KV_UNAVAILABLE_TIMEOUT_S.default
    """Seconds requests that need KV blocks wait for an unusable kvstore before they end with
    UNAVAILABLE."""
    attention_backend: str = settings.ATTENTION_BACKEND.default
    """"native" (the csrc kernel, built on first start; falls back to "reference" when it cannot
    be built) or "reference" (pure torch)."""
    batch_invariant: bool = settings.BATCH_INVARIANT.default
    """Run every projection and the lm_head through the batch-invariant native kernel (CPU), so a
    token's logits do not depend on the batch it is computed in."""
    nvml_script: str = settings.NVML_SCRIPT.default
    """Test only (hidden ``--nvml-script``): read GPU events and samples from this JSON-lines file
    (zerolayer.scheduler.gpu_health.script) instead of NVML; empty: NVML where a GPU exists."""


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """The public API the frontend serves."""

    listen: str = settings.LISTEN.default
    """Public gRPC address, ``HOST:PORT``."""
    http_listen: str = settings.HTTP_LISTEN.default
    """OpenAI-compatible HTTP address, ``HOST:PORT`` (zerolayer.frontend.openai.app); "": off."""
    default_max_new_tokens: int = settings.DEFAULT_MAX_NEW_TOKENS.default
    """max_new_tokens, in tokens, when a request leaves it 0."""


@dataclass(frozen=True, kw_only=True)
class AccessSettings:
    """Who may call the public API, and over what (the files: zerolayer.common.access; what the
    frontend does with tenants: zerolayer.frontend.tenants)."""

    tls_cert: str = settings.TLS_CERT.default
    """PEM certificate chain of the public port; empty: plaintext."""
    tls_key: str = settings.TLS_KEY.default
    """PEM private key of ``tls_cert``."""
    tls_client_ca: str = settings.TLS_CLIENT_CA.default
    """PEM CA certificates a client certificate must be signed by (mTLS); empty: none asked."""
    tenants: str = settings.TENANTS.default
    """JSON file of tenants and their bearer tokens' SHA-256 digests; empty: none."""

    @property
    def tls(self) -> bool:
        """The public port serves TLS (``--tls-cert`` given)."""
        return bool(self.tls_cert)


@dataclass(frozen=True, kw_only=True)
class RoutingSettings:
    """How the frontend spreads requests over the schedulers and carries them across a lost one."""

    scheduler_wait_s: float = settings.SCHEDULER_WAIT_S.default
    """Seconds a new request waits for a scheduler that can take it before UNAVAILABLE."""
    failover_wait_s: float = settings.FAILOVER_WAIT_S.default
    """Seconds a stream whose scheduler died waits for another (or the restarted) one."""
    routing: str = settings.ROUTING.default
    """"least-work" or "prefix-affine" (zerolayer.frontend.routing.router)."""


@dataclass(frozen=True)
class LoaderConfig(ModelSettings, DeviceSettings, LayerSettings):
    """Loader process settings."""

    address: str
    """gRPC address to serve on, e.g. ``unix:/run/zl/loader.sock``."""
    fd_keeper: str = settings.FD_KEEPER.default
    """Unix socket of the launcher's descriptor keeper (``--fd-keeper``; set by ``zerolayer up``):
    on a GPU, device memory deposited there survives this layer's restarts."""


@dataclass(frozen=True)
class KVStoreConfig(ArenaSettings, DeviceSettings, LayerSettings):
    """KV store process settings."""

    address: str
    """gRPC address to serve on."""
    loader_address: str
    """Where the loader serves (the arena's geometry comes from the model config)."""
    shm_path: str
    """Shared-memory file of the arena, e.g. ``/dev/shm/zerolayer-<id>.kv``."""
    remove_arena_on_exit: bool = settings.REMOVE_ARENA_ON_EXIT.default
    """Delete the arena file on a clean exit (off: the arena outlives the process, so a restarted
    kvstore reopens it; the launcher removes it when the whole stack stops)."""
    fd_keeper: str = settings.FD_KEEPER.default
    """Unix socket of the launcher's descriptor keeper (``--fd-keeper``): on a GPU, the arena's
    device memory deposited there survives this layer's restarts."""


@dataclass(frozen=True)
class SchedulerConfig(EngineSettings, DeviceSettings, LayerSettings):
    """Scheduler (engine) process settings."""

    address: str
    """gRPC address to serve on."""
    loader_address: str
    """Where the loader serves."""
    kvstore_address: str
    """Where the kvstore serves."""
    standby: bool = settings.STANDBY.default
    """Start as a warmed standby (``--standby``): NOT_SERVING on ``zerolayer.v1.Scheduler``
    until ``Activate``, SERVING on "" once warmed; calls it gets are served."""
    owner_id: str = settings.OWNER_ID.default
    """Who this scheduler is to the kvstore (the same across its restarts); empty: ``address``."""

    @property
    def kv_owner_id(self) -> str:
        """The owner id this scheduler registers with the kvstore: ``owner_id``, or ``address``
        (so a scheduler restarted on the same socket is the same owner)."""
        return self.owner_id or self.address


@dataclass(frozen=True)
class FrontendConfig(ApiSettings, AccessSettings, RoutingSettings, LayerSettings):
    """Frontend process settings."""

    loader_address: str
    """Where the loader serves (tokenizer, model info)."""
    scheduler_address: tuple[str, ...]
    """Where the schedulers serve, one address each (a lone string is taken as one address)."""
    instance_id: str = settings.INSTANCE_ID.default
    """Extra health name ``zerolayer.instance.<id>`` (lets a launcher recognise its own frontend
    on a TCP port another process might hold)."""
    reuse_port: bool = settings.REUSE_PORT.default
    """Share ``listen`` with the stack's other frontends (SO_REUSEPORT) and also listen on
    ``private_address`` (``--reuse-port``; needs one)."""
    private_address: str = settings.PRIVATE_ADDRESS.default
    """``unix:PATH`` where this frontend alone is reached (see
    ``zerolayer.common.server.LayerServer``); "": none."""
    max_stop_strings: int = 16
    """Most stop strings per request (a limit of the API, not a flag)."""
    max_cache_salt_bytes: int = 256
    """Longest cache_salt accepted, bytes (a limit of the API, not a flag)."""

    def __post_init__(self) -> None:
        # NOTE: one address given as a string (as before several were possible) is one address,
        # not a tuple of its characters.
        if isinstance(self.scheduler_address, str):
            object.__setattr__(self, "scheduler_address", (self.scheduler_address,))


def default_num_threads(num_cores: int) -> int:
    """The scheduler's torch threads when none are asked for: one per core, at least 1.

    With one thread per core, another busy process used to stall every OpenMP barrier of the
    forward (libgomp's threads spin 300,000 iterations before they sleep: batch-1 decode fell
    to 2.3 tok/s beside one busy process on 2 cores), which is why this was every core but one.
    The scheduler now starts libgomp with a short spin
    (:mod:`zerolayer.scheduler.openmp_waiting`), and one thread per core measured 37.4 tok/s
    quiet and 22.6 beside a busy process, against 22.8 and 22.0 with one thread fewer, and
    90-96% of libgomp's own spin on a quiet machine (docs/benchmarks.md, "threads").
    """
    return max(1, num_cores)
