"""A value other than the default for every declared setting, as typed and as parsed, and a
layer's config as its program builds it: what the settings tests give the parsers, ``up`` and
the launcher."""

from __future__ import annotations

import importlib

import pytest

from zerolayer.common import device
from zerolayer.common.layer_main import build_parser
from zerolayer.common.setting import config_from_args
from zerolayer.common.settings import Setting, layer_settings

SAMPLES: dict[str, tuple[str | None, object]] = {
    "address": ("unix:/run/zl/this.sock", "unix:/run/zl/this.sock"),
    "loader_address": ("unix:/run/zl/l.sock", "unix:/run/zl/l.sock"),
    "kvstore_address": ("unix:/run/zl/k.sock", "unix:/run/zl/k.sock"),
    "pin_kvstore_address": ("unix:/run/zl/k.sock", "unix:/run/zl/k.sock"),
    "scheduler_address": (
        "unix:/run/zl/s.sock,unix:/run/zl/t.sock",
        ("unix:/run/zl/s.sock", "unix:/run/zl/t.sock"),
    ),
    "shm_path": ("/dev/shm/zl-test.kv", "/dev/shm/zl-test.kv"),
    "fd_keeper": ("/run/zl/fds.sock", "/run/zl/fds.sock"),
    "instance_id": ("zl-test", "zl-test"),
    "standby": (None, True),
    "reuse_port": (None, True),
    "private_address": ("unix:/run/zl/frontend.sock", "unix:/run/zl/frontend.sock"),
    "model_dir": ("/models/llama", "/models/llama"),
    "model_name": ("llama-test", "llama-test"),
    "dtype": ("float32", "float32"),
    "prefetch": (None, False),
    "device": ("cuda:1", "cuda:1"),
    "kv_cache_bytes": ("1048576", 1048576),
    "block_size": ("32", 32),
    "enable_prefix_caching": (None, False),
    "owner_lease_s": ("1.5", 1.5),
    "max_pinned_fraction": ("0.4", 0.4),
    "max_pinned_fraction_per_namespace": ("0.1", 0.1),
    "testing_pin_clock": (None, True),
    "remove_arena_on_exit": (None, True),
    "max_num_seqs": ("8", 8),
    "max_num_batched_tokens": ("256", 256),
    "num_threads": ("3", 3),
    "kv_unavailable_timeout_s": ("2.5", 2.5),
    "owner_id": ("scheduler-0", "scheduler-0"),
    "attention_backend": ("reference", "reference"),
    "batch_invariant": (None, True),
    "nvml_script": ("/tmp/nvml.jsonl", "/tmp/nvml.jsonl"),
    "listen": ("127.0.0.1:50999", "127.0.0.1:50999"),
    "http_listen": ("127.0.0.1:8000", "127.0.0.1:8000"),
    "default_max_new_tokens": ("17", 17),
    "responses_max_stored": ("8", 8),
    "responses_max_age_s": ("90", 90.0),
    "max_grammar_bytes": ("64K", 65536),
    "scheduler_wait_s": ("0.5", 0.5),
    "failover_wait_s": ("5", 5.0),
    "scheduler_hung_after_s": ("2.5", 2.5),
    "routing": ("prefix-affine", "prefix-affine"),
    "tool_call_parser": ("hermes", "hermes"),
    "tls_cert": ("/etc/zl/server.pem", "/etc/zl/server.pem"),
    "tls_key": ("/etc/zl/server.key", "/etc/zl/server.key"),
    "tls_client_ca": ("/etc/zl/clients.pem", "/etc/zl/clients.pem"),
    "tenants": ("/etc/zl/tenants.json", "/etc/zl/tenants.json"),
    "metrics_port": ("9300", 9300),
    "metrics_host": ("0.0.0.0", "0.0.0.0"),
    "run_dir": ("/tmp/zl-run", "/tmp/zl-run"),
    "supervise": (None, False),
    "metrics_port_base": ("9200", 9200),
    "schedulers": ("2", 2),
    "standby_schedulers": ("1", 1),
    "frontends": ("3", 3),
    "startup_timeout_s": ("30", 30.0),
}
"""Setting name -> (the value's text, None for a switch; the value parsed)."""


def words(setting: Setting) -> list[str]:
    """The command-line words that give ``setting`` its sample value."""
    text, _ = SAMPLES[setting.name]
    return [setting.flag] if text is None else [setting.flag, text]


def value(setting: Setting) -> object:
    """The sample value of ``setting``, parsed."""
    return SAMPLES[setting.name][1]


def layer_config(layer: str, argv: list[str]) -> object:
    """``layer``'s config from ``argv``, parsed by its program's own parser and built as the
    program builds it (argparse's SystemExit on a bad flag)."""
    program = importlib.import_module(f"zerolayer.{layer}.__main__").PROGRAM
    args = build_parser(program).parse_args(argv)
    return config_from_args(program.config_type, layer_settings(layer), args)


def pretend_two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch seems to see two CUDA devices (only to resolve ``--device``): ``cuda:1`` parses."""
    monkeypatch.setattr(device, "_torch_cuda_device_count", lambda: 2)
