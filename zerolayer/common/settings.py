"""Every flag of the layers and of ``zerolayer up``, declared once: its default lives here.

The layers' flags are declared here, ``zerolayer up``'s own (run directory, supervision, metrics
ports, how many schedulers and frontends) in ``zerolayer.common.stack_settings``; :data:`SETTINGS`
holds both. The layers' parsers, ``zerolayer up``'s flags, ``StackConfig``'s defaults, the
launcher's command lines and the config dataclasses all derive from these declarations (see
``zerolayer.common.setting``: :func:`add_arguments`, :func:`config_from_args`,
:func:`command_line`); compose.yaml is checked against them (tests/test_compose.py).
"""

from __future__ import annotations

from zerolayer.common import stack_settings
from zerolayer.common.device import device_argument
from zerolayer.common.setting import (
    AtMost,
    Setting,
    host_port,
    host_port_or_empty,
    non_negative,
    parse_bytes,
    port_or_zero,
    positive,
    power_of_two,
    printable_name,
)

MAX_WAIT_S = 3600
"""Longest lease or wait a ``*_s`` setting takes, seconds: the lease goes to the kvstore in
milliseconds as a uint32, and the waits become timers."""
MAX_UINT32 = 2**32 - 1
"""Largest value of a protobuf ``uint32`` field."""
MAX_BLOCK_SIZE = 256
"""Largest ``--block-size``, tokens (as vLLM's): a prompt reuses a cached prefix only in whole
blocks, so a larger block would rarely be reused."""

LAYERS = ("loader", "kvstore", "scheduler", "frontend")
"""The layers, in start order (``zerolayer up`` stops them in the reverse one)."""
LOADER, KVSTORE, SCHEDULER, FRONTEND = LAYERS
INTERNAL = (LOADER, KVSTORE, SCHEDULER)
"""The layers behind the frontend (unix sockets, a device)."""

# -- wiring: the launcher sets these from the stack's layout; `up` does not offer them
ADDRESS = Setting(
    "address",
    "--address",
    "gRPC address to serve on, e.g. unix:PATH",
    layers=INTERNAL,
)
LOADER_ADDRESS = Setting(
    "loader_address", "--loader", "the loader's gRPC address", layers=(KVSTORE, SCHEDULER, FRONTEND)
)
KVSTORE_ADDRESS = Setting(
    "kvstore_address", "--kvstore", "the kvstore's gRPC address", layers=(SCHEDULER,)
)
SCHEDULER_ADDRESS = Setting(
    "scheduler_address",
    "--scheduler",
    "the schedulers' gRPC addresses: repeat the flag or give a comma list; each request goes to "
    "the one with the least outstanding work",
    metavar="ADDRESS",
    multiple=True,
    layers=(FRONTEND,),
)
SHM_PATH = Setting(
    "shm_path",
    "--shm-path",
    "file of the KV arena, on a shared-memory filesystem (reopened if it exists with the same "
    "layout and is this user's mode-0600 regular file; anything else there is refused)",
    layers=(KVSTORE,),
)
FD_KEEPER = Setting(
    "fd_keeper",
    "--fd-keeper",
    "unix socket of the launcher's descriptor keeper (zerolayer up sets it): on a GPU, device "
    "memory deposited there (weights, KV arena) survives restarts of this layer",
    default="",
    default_note="none",
    layers=(LOADER, KVSTORE),
)
INSTANCE_ID = Setting(
    "instance_id",
    "--instance-id",
    "also report health as zerolayer.instance.<ID> (the launcher's check of its own frontend)",
    default="",
    layers=(FRONTEND,),
)
STANDBY = Setting(
    "standby",
    "--standby",
    'start as a warmed standby: health SERVING on "" but NOT_SERVING on zerolayer.v1.Scheduler '
    "until Scheduler/Activate (zerolayer up promotes one when an active scheduler dies); calls "
    "it gets are served",
    default=False,
    layers=(SCHEDULER,),
)
REUSE_PORT = Setting(
    "reuse_port",
    "--reuse-port",
    "share --listen with the other frontends of the same stack (SO_REUSEPORT; zerolayer up sets "
    "it for --frontends > 1), and also serve on --private-address (needed), where the launcher "
    "reaches this process alone",
    default=False,
    layers=(FRONTEND,),
)
PRIVATE_ADDRESS = Setting(
    "private_address",
    "--private-address",
    "unix:PATH where this frontend alone is reached: its whole service with --reuse-port, "
    "grpc.health.v1 alone in plaintext with --tls-cert; zerolayer up sets unix:<run dir>/"
    "<frontend>.sock (in its private run dir: no other user can bind or connect to it)",
    default="",
    layers=(FRONTEND,),
)
# -- the model (loader)
MODEL_DIR = Setting(
    "model_dir",
    "--model",
    "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)",
    metavar="DIR",
    default_note="stories260K, llama2.c's tiny story model shipped with zerolayer",
    layers=(LOADER,),
    up=True,
)
MODEL_NAME = Setting(
    "model_name",
    "--served-model-name",
    "name the model is served under: GetModelInfo's model, the model a request may name, "
    "KServe's model_name, the traces' gen_ai.request.model",
    default="",
    check=printable_name,
    metavar="NAME",
    default_note="the model directory's base name (for a Hugging Face hub snapshot directory, "
    "its commit hash: give a name)",
    aliases=("--model-name",),
    layers=(LOADER,),
    up=True,
)
PREFETCH = Setting(
    "prefetch",
    "--no-prefetch",
    "skip the kernel read-ahead of the weight files at start",
    default=True,
    layers=(LOADER,),
    up=True,
)
DEVICE = Setting(
    "device",
    "--device",
    "cpu, cuda, cuda:N, or auto (a GPU if torch sees one): where the weights, the KV arena and "
    "the forward live; the loader, kvstore and scheduler must agree",
    default="cpu",
    parse=device_argument,
    layers=INTERNAL,
    up=True,
)

# -- the KV arena (kvstore)
KV_CACHE_BYTES = Setting(
    "kv_cache_bytes",
    "--kv-cache-bytes",
    "KV arena size, in bytes or with a binary unit (512M, 4G, 1T: 1K = 1024); all its pages are "
    "reserved at start, so it must fit the free space of the arena's filesystem",
    default=512 * 1024 * 1024,
    parse=parse_bytes,
    check=positive,
    unit="bytes",
    metavar="SIZE",
    default_note="512 MiB",
    layers=(KVSTORE,),
    up=True,
)
BLOCK_SIZE = Setting(
    "block_size",
    "--block-size",
    "tokens per KV block, a power of two (the attention kernels take any size, but then a key "
    "tile straddles blocks and a token's block is a division, not a shift); only whole blocks "
    "are reused by the prefix cache",
    default=16,
    check=AtMost(power_of_two, MAX_BLOCK_SIZE),
    unit="tokens",
    metavar="N",
    layers=(KVSTORE,),
    up=True,
)
PREFIX_CACHING = Setting(
    "enable_prefix_caching",
    "--no-prefix-caching",
    "never reuse KV blocks across requests (for comparison)",
    default=True,
    layers=(KVSTORE,),
    up=True,
)
OWNER_LEASE_S = Setting(
    "owner_lease_s",
    "--owner-lease-s",
    "lease of each scheduler registered with the kvstore: one that sends no keep-alive for this "
    "long loses its KV block references (its blocks stay cached); also how long a restarted "
    "kvstore waits for its schedulers to reconcile before it hands out blocks again",
    default=3.0,
    check=AtMost(positive, MAX_WAIT_S),
    unit="s",
    metavar="S",
    layers=(KVSTORE,),
    up=True,
)
REMOVE_ARENA_ON_EXIT = Setting(
    "remove_arena_on_exit",
    "--remove-arena-on-exit",
    "delete the arena file on a clean exit (default: keep it for a restart; zerolayer up "
    "removes it when the stack stops)",
    default=False,
    layers=(KVSTORE,),
)

# -- the engine (scheduler)
MAX_NUM_SEQS = Setting(
    "max_num_seqs",
    "--max-num-seqs",
    "most requests in the running set",
    default=64,
    check=positive,
    metavar="N",
    layers=(SCHEDULER,),
    up=True,
)
MAX_NUM_BATCHED_TOKENS = Setting(
    "max_num_batched_tokens",
    "--max-num-batched-tokens",
    "token budget of one step (prefill chunks plus decodes), i.e. the prefill chunk size",
    default=512,
    check=positive,
    unit="tokens",
    metavar="N",
    layers=(SCHEDULER,),
    up=True,
)
NUM_THREADS = Setting(
    "num_threads",
    "--num-threads",
    "torch intra-op threads of the engine",
    default=0,
    check=non_negative,
    metavar="N",
    default_note="one per available core; the scheduler sets GOMP_SPINCOUNT=100 unless "
    "GOMP_SPINCOUNT or OMP_WAIT_POLICY is set",
    layers=(SCHEDULER,),
    up=True,
)
KV_UNAVAILABLE_TIMEOUT_S = Setting(
    "kv_unavailable_timeout_s",
    "--kv-unavailable-timeout-s",
    "how long requests that need KV blocks wait for an unusable kvstore (down, restarting) "
    "before they end with UNAVAILABLE",
    default=30.0,
    check=AtMost(positive, MAX_WAIT_S),
    unit="s",
    metavar="S",
    layers=(SCHEDULER,),
    up=True,
)
OWNER_ID = Setting(
    "owner_id",
    "--owner-id",
    "who this scheduler is to the kvstore: keep it across restarts of the same scheduler and "
    "different between schedulers sharing a kvstore",
    default="",
    default_note="the scheduler's --address",
    layers=(SCHEDULER,),
)
ATTENTION_BACKEND = Setting(
    "attention_backend",
    "--attention-backend",
    "paged attention: native (the csrc kernel, built once and cached; reference when it cannot "
    "be built) or reference (pure torch)",
    default="native",
    choices=("native", "reference"),
    layers=(SCHEDULER,),
    up=True,
)
BATCH_INVARIANT = Setting(
    "batch_invariant",
    "--batch-invariant",
    "batch-invariant CPU forward: every projection and the lm_head through the csrc kernel whose "
    "result for a token does not depend on the batch, so greedy and seeded outputs are identical "
    "token for token alone, batched, or continued on another scheduler after a failover; slower "
    "prefill and batched decode than torch's GEMM (docs/benchmarks.md); needs the native kernels",
    default=False,
    layers=(SCHEDULER,),
    up=True,
)
NVML_SCRIPT = Setting(
    "nvml_script",
    "--nvml-script",
    "test only: GPU events and samples from this JSON-lines file instead of NVML",
    default="",
    layers=(SCHEDULER,),
    hidden=True,
)

# -- the public API (frontend)
LISTEN = Setting(
    "listen",
    "--listen",
    "public gRPC address (IPv6 in brackets: [::1]:PORT)",
    default="127.0.0.1:50051",
    check=host_port,
    metavar="HOST:PORT",
    layers=(FRONTEND,),
    up=True,
)
HTTP_LISTEN = Setting(
    "http_listen",
    "--http-listen",
    "also serve an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
    "/v1/models, /health, /ready) on this address, with the TLS and tenants of --listen",
    default="",
    check=host_port_or_empty,
    metavar="HOST:PORT",
    default_note="off",
    layers=(FRONTEND,),
    up=True,
)
DEFAULT_MAX_NEW_TOKENS = Setting(
    "default_max_new_tokens",
    "--default-max-new-tokens",
    "max_new_tokens of a request that leaves it 0",
    default=64,
    check=AtMost(positive, MAX_UINT32),
    unit="tokens",
    metavar="N",
    layers=(FRONTEND,),
    up=True,
)

SCHEDULER_WAIT_S = Setting(
    "scheduler_wait_s",
    "--scheduler-wait-s",
    "how long a new request waits for a scheduler that can take it (all down, restarting or "
    "starting) before it ends with UNAVAILABLE",
    default=2.0,
    check=AtMost(positive, MAX_WAIT_S),
    unit="s",
    metavar="S",
    layers=(FRONTEND,),
    up=True,
)
FAILOVER_WAIT_S = Setting(
    "failover_wait_s",
    "--failover-wait-s",
    "how long a stream whose scheduler died waits for another one (or the restarted one) to "
    "continue on before it ends with UNAVAILABLE",
    default=30.0,
    check=AtMost(positive, MAX_WAIT_S),
    unit="s",
    metavar="S",
    layers=(FRONTEND,),
    up=True,
)
ROUTING = Setting(
    "routing",
    "--routing",
    "how a request's scheduler is chosen: least-work (the least outstanding tokens) or "
    "prefix-affine (the one its prompt's first tokens hash to, unless that one is far busier)",
    default="least-work",
    choices=("least-work", "prefix-affine"),
    layers=(FRONTEND,),
    up=True,
)

TLS_CERT = Setting(
    "tls_cert",
    "--tls-cert",
    "PEM certificate chain of the public port, which then serves TLS only (with --tls-key)",
    default="",
    metavar="PEM",
    default_note="plaintext",
    layers=(FRONTEND,),
    up=True,
)
TLS_KEY = Setting(
    "tls_key",
    "--tls-key",
    "PEM private key of --tls-cert (unencrypted; keep it mode 0600)",
    default="",
    metavar="PEM",
    layers=(FRONTEND,),
    up=True,
)
TLS_CLIENT_CA = Setting(
    "tls_client_ca",
    "--tls-client-ca",
    "PEM CA certificates: with --tls-cert, require a client certificate signed by one of them "
    "(mTLS); its subject's common name is then the caller's tenant",
    default="",
    metavar="PEM",
    default_note="no client certificates",
    layers=(FRONTEND,),
    up=True,
)

TENANTS = Setting(
    "tenants",
    "--tenants",
    "JSON file of tenants and the SHA-256 digests of their bearer tokens: a Generate call must "
    "then carry 'authorization: Bearer TOKEN' (or an mTLS client certificate) and reuses only "
    "its own tenant's cached prefixes",
    default="",
    metavar="FILE",
    default_note="callers are not identified",
    layers=(FRONTEND,),
    up=True,
)

# -- every layer
METRICS_PORT = Setting(
    "metrics_port",
    "--metrics-port",
    "Prometheus /metrics port (zerolayer up: from --metrics-port-base)",
    default=0,
    check=port_or_zero,
    metavar="PORT",
    default_note="off",
    layers=LAYERS,
)
METRICS_HOST = Setting(
    "metrics_host",
    "--metrics-host",
    "address the /metrics endpoints bind (0.0.0.0 in containers)",
    default="127.0.0.1",
    layers=LAYERS,
    up=True,
)


# NOTE: collected rather than listed, so a new declaration cannot be left out.
SETTINGS = (
    *(value for value in dict(globals()).values() if isinstance(value, Setting)),
    *stack_settings.STACK_SETTINGS,
)
"""Every declaration above, in order, then ``zerolayer up``'s own (``stack_settings``)."""


def layer_settings(layer: str) -> tuple[Setting, ...]:
    """The flags of ``layer``'s program, in declaration order."""
    return tuple(setting for setting in SETTINGS if layer in setting.layers)


def up_settings() -> tuple[Setting, ...]:
    """The flags ``zerolayer up`` offers: the fields of ``StackConfig`` a user may set."""
    return tuple(setting for setting in SETTINGS if setting.up)
