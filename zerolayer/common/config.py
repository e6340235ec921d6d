"""Frozen per-layer configs, built once at the process edge (CLI / ``__main__``) from the flags
of ``zerolayer.common.settings``.

A field that is a flag is declared from its :class:`~zerolayer.common.setting.Setting`
(:func:`setting_field`): the default is the declaration's, and the declaration's help (with unit
and default) is the field's documentation, rendered into the class docstring by
:func:`documented` (``help(SchedulerConfig)``) and readable as ``field.metadata["setting"]``.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from zerolayer.common import settings
from zerolayer.common.setting import REQUIRED, Setting

ConfigT = TypeVar("ConfigT", bound=type)

SETTING = "setting"
"""Key of a config field's :class:`Setting` in its ``metadata``."""

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


def setting_field(setting: Setting) -> Any:
    """A config dataclass field declared by ``setting``: its default (none when it is
    :data:`~zerolayer.common.setting.REQUIRED`) and, in its metadata under :data:`SETTING`,
    the setting, whose help documents the field."""
    default = MISSING if setting.default is REQUIRED else setting.default
    return field(default=default, metadata={SETTING: setting})


def documented(cls: ConfigT) -> ConfigT:
    """Appends to the docstring of the config dataclass ``cls`` one line per field declared by
    :func:`setting_field` (inherited ones too): its name, flag, help, unit and default.

    Raises:
        TypeError: a field is named other than its setting (``Setting.name`` is the field).
    """
    lines = []
    for config_field in fields(cls):
        setting = config_field.metadata.get(SETTING)
        if setting is None:
            continue
        if config_field.name != setting.name:
            raise TypeError(f"{cls.__name__}.{config_field.name}: declared by {setting.name!r}")
        lines.append(f"    {setting.name} (``{setting.flag}``): {setting.description()}")
    if lines:
        doc = inspect.cleandoc(cls.__doc__ or "")
        cls.__doc__ = "\n".join([doc, "", "Fields from flags:", *lines])
    return cls


def check_settings(config: object) -> None:
    """Checks each field of the config dataclass ``config`` that a setting declares, by that
    setting (:meth:`Setting.validate`): a value given in code meets the flag's checks.

    Raises:
        ValueError: a value cannot work; the message starts with the flag.
    """
    for config_field in fields(config):  # type: ignore[arg-type]
        setting = config_field.metadata.get(SETTING)
        if setting is not None:
            setting.validate(getattr(config, config_field.name))


# Groups of settings that several configs hold (``StackConfig`` holds every group ``zerolayer
# up`` offers). Their fields are keyword-only, so a config's own required fields may follow.


@documented
@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    """Where a layer's Prometheus endpoint binds."""

    metrics_host: str = setting_field(settings.METRICS_HOST)


@documented
@dataclass(frozen=True, kw_only=True)
class LayerSettings(MetricsSettings):
    """What every layer process has."""

    metrics_port: int = setting_field(settings.METRICS_PORT)


@documented
@dataclass(frozen=True, kw_only=True)
class InternalLayerSettings(LayerSettings):
    """What every internal layer (loader, kvstore, scheduler) has: its own unix address."""

    address: str = setting_field(settings.ADDRESS)


@documented
@dataclass(frozen=True, kw_only=True)
class LoaderClientSettings:
    """Where a layer that reads the model's manifest finds the loader."""

    loader_address: str = setting_field(settings.LOADER_ADDRESS)


@documented
@dataclass(frozen=True, kw_only=True)
class FdKeeperSettings:
    """The process that keeps a layer's exported file descriptors across its restarts."""

    fd_keeper: str = setting_field(settings.FD_KEEPER)


@documented
@dataclass(frozen=True, kw_only=True)
class DeviceSettings:
    """Where the loader, kvstore and scheduler keep their memory and compute (see
    :mod:`zerolayer.common.device`)."""

    device: str = setting_field(settings.DEVICE)


@documented
@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The model the loader serves."""

    model_dir: str = setting_field(settings.MODEL_DIR)
    model_name: str = setting_field(settings.MODEL_NAME)
    dtype: str = setting_field(settings.DTYPE)
    prefetch: bool = setting_field(settings.PREFETCH)


@documented
@dataclass(frozen=True, kw_only=True)
class ArenaSettings:
    """The KV arena the kvstore owns: ``kv_cache_bytes // block_bytes`` blocks of ``block_size``
    tokens."""

    kv_cache_bytes: int = setting_field(settings.KV_CACHE_BYTES)
    block_size: int = setting_field(settings.BLOCK_SIZE)
    enable_prefix_caching: bool = setting_field(settings.PREFIX_CACHING)
    owner_lease_s: float = setting_field(settings.OWNER_LEASE_S)
    max_pinned_fraction: float = setting_field(settings.MAX_PINNED_FRACTION)
    max_pinned_fraction_per_namespace: float = setting_field(
        settings.MAX_PINNED_FRACTION_PER_NAMESPACE
    )
    testing_pin_clock: bool = setting_field(settings.TESTING_PIN_CLOCK)


@documented
@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """How the scheduler batches and runs requests (``num_threads`` 0: one per available core,
    :func:`default_num_threads`)."""

    max_num_seqs: int = setting_field(settings.MAX_NUM_SEQS)
    max_num_batched_tokens: int = setting_field(settings.MAX_NUM_BATCHED_TOKENS)
    num_threads: int = setting_field(settings.NUM_THREADS)
    kv_unavailable_timeout_s: float = setting_field(settings.KV_UNAVAILABLE_TIMEOUT_S)
    attention_backend: str = setting_field(settings.ATTENTION_BACKEND)
    batch_invariant: bool = setting_field(settings.BATCH_INVARIANT)
    nvml_script: str = setting_field(settings.NVML_SCRIPT)


@documented
@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """The public API the frontend serves."""

    listen: str = setting_field(settings.LISTEN)
    http_listen: str = setting_field(settings.HTTP_LISTEN)
    default_max_new_tokens: int = setting_field(settings.DEFAULT_MAX_NEW_TOKENS)
    responses_max_stored: int = setting_field(settings.RESPONSES_MAX_STORED)
    responses_max_age_s: float = setting_field(settings.RESPONSES_MAX_AGE_S)
    max_grammar_bytes: int = setting_field(settings.MAX_GRAMMAR_BYTES)
    tool_call_parser: str = setting_field(settings.TOOL_CALL_PARSER)


@documented
@dataclass(frozen=True, kw_only=True)
class AccessSettings:
    """Who may call the public API, and over what (the files: zerolayer.common.access; what the
    frontend does with tenants: zerolayer.frontend.tenants)."""

    tls_cert: str = setting_field(settings.TLS_CERT)
    tls_key: str = setting_field(settings.TLS_KEY)
    tls_client_ca: str = setting_field(settings.TLS_CLIENT_CA)
    tenants: str = setting_field(settings.TENANTS)

    @property
    def tls(self) -> bool:
        """The public port serves TLS (``--tls-cert`` given)."""
        return bool(self.tls_cert)


@documented
@dataclass(frozen=True, kw_only=True)
class RoutingSettings:
    """How the frontend spreads requests over the schedulers and carries them across a lost one
    (zerolayer.frontend.routing.router)."""

    scheduler_wait_s: float = setting_field(settings.SCHEDULER_WAIT_S)
    failover_wait_s: float = setting_field(settings.FAILOVER_WAIT_S)
    scheduler_hung_after_s: float = setting_field(settings.SCHEDULER_HUNG_AFTER_S)
    routing: str = setting_field(settings.ROUTING)


@documented
@dataclass(frozen=True)
class LoaderConfig(ModelSettings, FdKeeperSettings, DeviceSettings, InternalLayerSettings):
    """Loader process settings."""


@documented
@dataclass(frozen=True)
class KVStoreConfig(
    ArenaSettings, LoaderClientSettings, FdKeeperSettings, DeviceSettings, InternalLayerSettings
):
    """KV store process settings (the arena's geometry comes from the loader's model config)."""

    shm_path: str = setting_field(settings.SHM_PATH)
    remove_arena_on_exit: bool = setting_field(settings.REMOVE_ARENA_ON_EXIT)


@documented
@dataclass(frozen=True)
class SchedulerConfig(EngineSettings, LoaderClientSettings, DeviceSettings, InternalLayerSettings):
    """Scheduler (engine) process settings."""

    kvstore_address: str = setting_field(settings.KVSTORE_ADDRESS)
    standby: bool = setting_field(settings.STANDBY)
    owner_id: str = setting_field(settings.OWNER_ID)

    @property
    def kv_owner_id(self) -> str:
        """The owner id this scheduler registers with the kvstore: ``owner_id``, or ``address``
        (so a scheduler restarted on the same socket is the same owner)."""
        return self.owner_id or self.address


@documented
@dataclass(frozen=True)
class FrontendConfig(
    ApiSettings, AccessSettings, RoutingSettings, LoaderClientSettings, LayerSettings
):
    """Frontend process settings."""

    scheduler_address: tuple[str, ...] = setting_field(settings.SCHEDULER_ADDRESS)
    pin_kvstore_address: str = setting_field(settings.PIN_KVSTORE_ADDRESS)
    instance_id: str = setting_field(settings.INSTANCE_ID)
    reuse_port: bool = setting_field(settings.REUSE_PORT)
    private_address: str = setting_field(settings.PRIVATE_ADDRESS)
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
