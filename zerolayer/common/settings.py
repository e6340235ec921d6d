"""Every flag of the layers and of ``zerolayer up``, declared once: its words (flag, help, unit)
and its default live here and nowhere else.

The layers' flags are declared here, ``zerolayer up``'s own (run directory, supervision, metrics
ports, how many schedulers and frontends) in ``zerolayer.common.stack_settings``; :data:`SETTINGS`
holds both. The layers' parsers, ``zerolayer up``'s flags, the launcher's command lines and the
config dataclasses' fields, defaults and field documentation all derive from these declarations
(see ``zerolayer.common.setting``: :func:`add_arguments`, :func:`config_from_args`,
:func:`command_line`; ``zerolayer.common.config``: :func:`setting_field`); compose.yaml is checked
against them (tests/test_compose.py).

A flag that ``up`` offers and that is named after its field is declared with
:func:`~zerolayer.common.stack_settings.offered`, or with a kind that states a rule once:
:func:`seconds` (a lease or wait), :func:`tokens`, :func:`fraction` (a share, 0 to 1),
:func:`choice`, :func:`access_file`.
"""

from __future__ import annotations

from collections.abc import Callable

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
from zerolayer.common.stack_settings import offered

MAX_WAIT_S = 3600
"""Longest lease or wait a ``*_s`` setting takes, seconds: the lease goes to the kvstore in
milliseconds as a uint32, and the waits become timers."""
MAX_UINT32 = 2**32 - 1
"""Largest value of a protobuf ``uint32`` field."""
PUBLIC_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""Largest request the public API reads (a gRPC message, an HTTP body), bytes."""
MAX_BLOCK_SIZE = 256
"""Largest ``--block-size``, tokens (as vLLM's): a prompt reuses a cached prefix only in whole
blocks, so a larger block would rarely be reused."""

LAYERS = ("loader", "kvstore", "scheduler", "frontend")
"""The layers, in start order (``zerolayer up`` stops them in the reverse one)."""
LOADER, KVSTORE, SCHEDULER, FRONTEND = LAYERS
INTERNAL = (LOADER, KVSTORE, SCHEDULER)
"""The layers behind the frontend (unix sockets, a device)."""


def seconds(flag: str, help: str, default: float, layer: str) -> Setting:
    """A lease or wait that ``layer`` takes and ``zerolayer up`` offers: seconds, a finite number
    > 0 and at most :data:`MAX_WAIT_S`."""
    check = AtMost(positive, MAX_WAIT_S)
    return offered(flag, help, default, check=check, unit="s", metavar="S", layers=(layer,))


def tokens(flag: str, help: str, default: int, check: Callable[[int], None], layer: str) -> Setting:
    """A number of tokens that ``layer`` takes and ``zerolayer up`` offers, checked by
    ``check``."""
    return offered(flag, help, default, check=check, unit="tokens", metavar="N", layers=(layer,))


def fraction(flag: str, help: str, default: float, layer: str) -> Setting:
    """A share of something that ``layer`` takes and ``zerolayer up`` offers: a number from 0 to
    1."""
    check = AtMost(non_negative, 1)
    return offered(flag, help, default, check=check, metavar="F", layers=(layer,))


def choice(flag: str, help: str, choices: tuple[str, ...], layer: str) -> Setting:
    """One of ``choices``, the first by default, that ``layer`` takes and ``zerolayer up``
    offers."""
    return offered(flag, help, choices[0], choices=choices, layers=(layer,))


def access_file(flag: str, help: str, metavar: str, default_note: str = "") -> Setting:
    """A file of the public API's access control (TLS, tenants) that the frontend reads and
    ``zerolayer up`` offers; empty, the default: none."""
    return offered(flag, help, "", metavar=metavar, default_note=default_note, layers=(FRONTEND,))


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
PIN_KVSTORE_ADDRESS = Setting(
    "pin_kvstore_address",
    "--pin-kvstore",
    "the kvstore's gRPC address, where the frontend makes and ends the prompt-cache pins that "
    "requests ask for; empty: none (asked-for pins are refused as pin-kvstore-unavailable)",
    "",
    layers=(FRONTEND,),
)
"""Optional, unlike the scheduler's ``--kvstore``: a frontend without it serves every request, and
only refuses pins."""
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
    "Hugging Face model directory (config.json, *.safetensors, tokenizer.json), or a GGUF "
    "file (or a directory with one, or with the parts NAME-0000i-of-0000N.gguf of a split one)",
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
DTYPE = choice(
    "--dtype",
    "what the activations and the KV cache are in: auto (a safetensors checkpoint's stored "
    "dtype; for a GGUF file float32 when every matrix is F32, else bfloat16), bfloat16 or "
    "float32 (a safetensors checkpoint takes only its stored dtype)",
    ("auto", "bfloat16", "float32"),
    LOADER,
)
PREFETCH = Setting(
    "prefetch",
    "--no-prefetch",
    "skip the kernel read-ahead of the weight files at start",
    default=True,
    layers=(LOADER,),
    up=True,
)
DEVICE = offered(
    "--device",
    "cpu, cuda, cuda:N, or auto (a GPU if torch sees one): where the weights, the KV arena and "
    "the forward live; the loader, kvstore and scheduler must agree",
    default="cpu",
    parse=device_argument,
    layers=INTERNAL,
)

# -- the KV arena (kvstore)
KV_CACHE_BYTES = offered(
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
)
BLOCK_SIZE = tokens(
    "--block-size",
    "tokens per KV block, a power of two (the attention kernels take any size, but then a key "
    "tile straddles blocks and a token's block is a division, not a shift); only whole blocks "
    "are reused by the prefix cache",
    16,
    AtMost(power_of_two, MAX_BLOCK_SIZE),
    KVSTORE,
)
PREFIX_CACHING = Setting(
    "enable_prefix_caching",
    "--no-prefix-caching",
    "never reuse KV blocks across requests (for comparison)",
    default=True,
    layers=(KVSTORE,),
    up=True,
)
OWNER_LEASE_S = seconds(
    "--owner-lease-s",
    "lease of each scheduler registered with the kvstore: one that sends no keep-alive for this "
    "long loses its KV block references (its blocks stay cached); also how long a restarted "
    "kvstore waits for its schedulers to reconcile before it hands out blocks again",
    3.0,
    KVSTORE,
)
MAX_PINNED_FRACTION = fraction(
    "--max-pinned-fraction",
    "share of the KV pool's blocks that pins (prefixes kept cached until their deadline) may hold "
    "in all namespaces together, 0 to 1 (0: no pins); the rest always serves running requests",
    0.5,
    KVSTORE,
)
MAX_PINNED_FRACTION_PER_NAMESPACE = fraction(
    "--max-pinned-fraction-per-namespace",
    "share of the KV pool's blocks that the pins of one namespace (tenant, cache salt) may hold, "
    "0 to 1",
    0.25,
    KVSTORE,
)
TESTING_PIN_CLOCK = Setting(
    "testing_pin_clock",
    "--testing-pin-clock",
    "test only: the pins' deadlines follow a clock that the AdvancePinClock call moves forward "
    "(owners' leases and a restart's recovery keep the real clock)",
    default=False,
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
MAX_NUM_SEQS = offered(
    "--max-num-seqs",
    "most requests in the running set",
    default=64,
    check=positive,
    metavar="N",
    layers=(SCHEDULER,),
)
MAX_NUM_BATCHED_TOKENS = tokens(
    "--max-num-batched-tokens",
    "token budget of one step (prefill chunks plus decodes), i.e. the prefill chunk size",
    512,
    positive,
    SCHEDULER,
)
NUM_THREADS = offered(
    "--num-threads",
    "torch intra-op threads of the engine",
    default=0,
    check=non_negative,
    metavar="N",
    default_note="one per available core; the scheduler sets GOMP_SPINCOUNT=100 unless "
    "GOMP_SPINCOUNT or OMP_WAIT_POLICY is set",
    layers=(SCHEDULER,),
)
KV_UNAVAILABLE_TIMEOUT_S = seconds(
    "--kv-unavailable-timeout-s",
    "how long requests that need KV blocks wait for an unusable kvstore (down, restarting) "
    "before they end with UNAVAILABLE",
    30.0,
    SCHEDULER,
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
ATTENTION_BACKEND = choice(
    "--attention-backend",
    "paged attention: native (the csrc kernel, built once and cached; reference when it cannot "
    "be built) or reference (pure torch)",
    ("native", "reference"),
    SCHEDULER,
)
BATCH_INVARIANT = offered(
    "--batch-invariant",
    "batch-invariant CPU forward: every projection and the lm_head through the csrc kernel whose "
    "result for a token does not depend on the batch, so greedy and seeded outputs are identical "
    "token for token alone, batched, or continued on another scheduler after a failover; slower "
    "prefill and batched decode than torch's GEMM (docs/benchmarks.md); needs the native kernels",
    default=False,
    layers=(SCHEDULER,),
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
LISTEN = offered(
    "--listen",
    "public gRPC address (IPv6 in brackets: [::1]:PORT)",
    default="127.0.0.1:50051",
    check=host_port,
    metavar="HOST:PORT",
    layers=(FRONTEND,),
)
HTTP_LISTEN = offered(
    "--http-listen",
    "also serve an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
    "/v1/models, /health, /ready) and Anthropic's Messages API (/v1/messages, "
    "/v1/messages/count_tokens) on this address, with the TLS and tenants of --listen",
    default="",
    check=host_port_or_empty,
    metavar="HOST:PORT",
    default_note="off",
    layers=(FRONTEND,),
)
DEFAULT_MAX_NEW_TOKENS = tokens(
    "--default-max-new-tokens",
    "max_new_tokens of a request that leaves it 0",
    64,
    AtMost(positive, MAX_UINT32),
    FRONTEND,
)

MAX_STORED_RESPONSE_AGE_S = 30 * 24 * 3600
"""Longest ``--responses-max-age-s``, seconds (OpenAI keeps a stored response 30 days)."""
RESPONSES_MAX_STORED = offered(
    "--responses-max-stored",
    "most responses the HTTP API's /v1/responses keeps (store: true) for previous_response_id "
    "and GET, in the frontend's memory; storing one more drops the oldest",
    default=1024,
    check=AtMost(positive, MAX_UINT32),
    unit="responses",
    metavar="N",
    layers=(FRONTEND,),
)
RESPONSES_MAX_AGE_S = offered(
    "--responses-max-age-s",
    "how long the HTTP API's /v1/responses keeps a stored response before it drops it",
    default=3600.0,
    check=AtMost(positive, MAX_STORED_RESPONSE_AGE_S),
    unit="s",
    metavar="S",
    layers=(FRONTEND,),
)
MAX_GRAMMAR_BYTES = offered(
    "--max-grammar-bytes",
    "largest structured-output constraint a request may carry (a JSON schema, regex or Lark "
    "grammar, e.g. response_format's json_schema), in bytes or with a binary unit (64K, 1M); a "
    "larger one is refused with INVALID_ARGUMENT before it compiles, since compile time grows "
    "faster than the text (docs/structured-output.md, Limits)",
    default=128 * 1024,
    parse=parse_bytes,
    check=AtMost(positive, PUBLIC_MAX_MESSAGE_BYTES),
    unit="bytes",
    metavar="SIZE",
    default_note="128 KiB",
    layers=(FRONTEND,),
)

SCHEDULER_WAIT_S = seconds(
    "--scheduler-wait-s",
    "how long a new request waits for a scheduler that can take it (all down, restarting or "
    "starting) before it ends with UNAVAILABLE",
    2.0,
    FRONTEND,
)
FAILOVER_WAIT_S = seconds(
    "--failover-wait-s",
    "how long a stream whose scheduler died waits for another one (or the restarted one) to "
    "continue on before it ends with UNAVAILABLE",
    30.0,
    FRONTEND,
)
SCHEDULER_HUNG_AFTER_S = seconds(
    "--scheduler-hung-after-s",
    "how long a scheduler may leave the frontend's keepalive ping (sent every second) unanswered "
    "before the frontend takes it for hung (e.g. stopped with SIGSTOP): it is taken out of "
    "routing and its streams fail over",
    5.0,
    FRONTEND,
)
ROUTING = choice(
    "--routing",
    "how a request's scheduler is chosen: least-work (the least outstanding tokens) or "
    "prefix-affine (the one its prompt's first tokens hash to, unless that one is far busier)",
    ("least-work", "prefix-affine"),
    FRONTEND,
)
TOOL_CALL_PARSER = choice(
    "--tool-call-parser",
    "how chat output is parsed into tool calls: auto (the format the model's chat template "
    "writes calls in), hermes (<tool_call> tags: Hermes, Qwen2.5, Qwen3), llama3_json "
    "(Llama 3.x JSON), mistral ([TOOL_CALLS]) or none (no tool calls: requests with tools are "
    "refused)",
    ("auto", "hermes", "llama3_json", "mistral", "none"),
    FRONTEND,
)

TLS_CERT = access_file(
    "--tls-cert",
    "PEM certificate chain of the public port, which then serves TLS only (with --tls-key)",
    "PEM",
    "plaintext",
)
TLS_KEY = access_file(
    "--tls-key",
    "PEM private key of --tls-cert (unencrypted; keep it mode 0600)",
    "PEM",
)
TLS_CLIENT_CA = access_file(
    "--tls-client-ca",
    "PEM CA certificates: with --tls-cert, require a client certificate signed by one of them "
    "(mTLS); its subject's common name is then the caller's tenant",
    "PEM",
    "no client certificates",
)

TENANTS = access_file(
    "--tenants",
    "JSON file of tenants and the SHA-256 digests of their bearer tokens: a Generate call must "
    "then carry 'authorization: Bearer TOKEN' (or an mTLS client certificate) and reuses only "
    "its own tenant's cached prefixes",
    "FILE",
    "callers are not identified",
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
METRICS_HOST = offered(
    "--metrics-host",
    "address the /metrics endpoints bind (0.0.0.0 in containers)",
    default="127.0.0.1",
    layers=LAYERS,
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
