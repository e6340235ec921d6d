"""The declarations of zerolayer.common.settings against what derives from them: each layer's
parser and config, the config dataclasses' defaults, the checks."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from common.setting_samples import SAMPLES, layer_config, pretend_two_gpus, value, words

from zerolayer.common.config import (
    SETTING,
    FrontendConfig,
    KVStoreConfig,
    LoaderConfig,
    SchedulerConfig,
    documented,
    setting_field,
)
from zerolayer.common.setting import REQUIRED, AtMost, Setting, positive
from zerolayer.common.settings import (
    LAYERS,
    MAX_NUM_SEQS,
    OWNER_LEASE_S,
    SETTINGS,
    layer_settings,
    up_settings,
)
from zerolayer.scheduler.engine_factory import EngineConfig
from zerolayer.stack.config import StackConfig

CONFIGS = {
    "loader": LoaderConfig,
    "kvstore": KVStoreConfig,
    "scheduler": SchedulerConfig,
    "frontend": FrontendConfig,
}
API_LIMITS = {"max_stop_strings", "max_cache_salt_bytes"}
"""FrontendConfig fields that are limits of the API, not flags."""
STACK_ONLY = {"nvml_script", "log_dir", "max_restart_backoff_s"}
"""StackConfig fields that ``zerolayer up`` does not offer (tests and benchmarks set them)."""
LAYER_PAIRS = [(layer, s) for layer in LAYERS for s in layer_settings(layer)]


def required_words(layer: str, but: Setting | None = None) -> list[str]:
    """The sample words of every flag ``layer`` requires (except ``but``)."""
    return [
        word
        for setting in layer_settings(layer)
        if setting.default is REQUIRED and setting != but
        for word in words(setting)
    ]


def field_defaults(config_type: type) -> dict[str, object]:
    return {
        field.name: REQUIRED if field.default is dataclasses.MISSING else field.default
        for field in dataclasses.fields(config_type)
    }


def test_every_setting_has_a_sample_other_than_its_default() -> None:
    assert set(SAMPLES) == {setting.name for setting in SETTINGS}
    for setting in SETTINGS:
        assert value(setting) != setting.default, setting.name


def test_each_setting_is_declared_once_with_its_own_flag() -> None:
    assert len({setting.name for setting in SETTINGS}) == len(SETTINGS)
    assert len({setting.flag for setting in SETTINGS}) == len(SETTINGS)


@pytest.mark.parametrize(("layer", "setting"), LAYER_PAIRS, ids=lambda x: getattr(x, "flag", x))
def test_a_setting_parses_in_each_of_its_layers_and_reaches_that_layers_config(
    layer: str, setting: Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_two_gpus(monkeypatch)
    config = layer_config(layer, [*required_words(layer, but=setting), *words(setting)])
    assert type(config) is CONFIGS[layer]
    assert getattr(config, setting.name) == value(setting)


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_given_only_its_required_flags_gets_every_default(layer: str) -> None:
    config = layer_config(layer, required_words(layer))
    assert type(config) is CONFIGS[layer]
    for setting in layer_settings(layer):
        expected = value(setting) if setting.default is REQUIRED else setting.default
        assert getattr(config, setting.name) == expected, setting.flag


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_config_holds_exactly_its_layers_settings_with_their_defaults(layer: str) -> None:
    defaults = field_defaults(CONFIGS[layer])
    declared = {setting.name: setting.default for setting in layer_settings(layer)}
    assert {name: defaults[name] for name in declared} == declared
    assert set(defaults) - set(declared) == (API_LIMITS if layer == "frontend" else set())


def test_stack_config_holds_every_up_setting_with_its_default() -> None:
    defaults = field_defaults(StackConfig)
    offered = {setting.name: setting.default for setting in up_settings()}
    assert {name: defaults[name] for name in offered} == offered
    assert set(defaults) - set(offered) == STACK_ONLY
    nvml_script = next(s for s in SETTINGS if s.name == "nvml_script")
    assert defaults["nvml_script"] == nvml_script.default


@pytest.mark.parametrize("config_type", [*CONFIGS.values(), StackConfig, EngineConfig])
def test_a_config_takes_each_flags_field_its_default_and_its_words_from_the_declaration(
    config_type: type,
) -> None:
    declared = {setting.name: setting for setting in SETTINGS}
    for field in dataclasses.fields(config_type):
        if field.name not in declared:
            continue
        setting = declared[field.name]
        assert field.metadata[SETTING] is setting, field.name
        line = f"    {setting.name} (``{setting.flag}``): {setting.description()}"
        assert line in config_type.__doc__.splitlines(), field.name
    assert "Fields from flags:" in config_type.__doc__


def test_a_config_field_named_other_than_its_setting_is_refused() -> None:
    with pytest.raises(TypeError, match="^Wrong.max_seqs: declared by 'max_num_seqs'$"):

        @documented
        @dataclasses.dataclass(frozen=True)
        class Wrong:
            max_seqs: int = setting_field(MAX_NUM_SEQS)


def test_the_scheduler_defaults_are_the_declared_ones() -> None:
    config = SchedulerConfig(address="a", loader_address="b", kvstore_address="c")
    assert config.max_num_seqs == MAX_NUM_SEQS.default == 64
    assert StackConfig(model_dir="/m").max_num_seqs == 64


@pytest.mark.parametrize(
    ("flag", "text", "reason"),
    [
        ("--max-num-seqs", "0", "must be > 0"),
        ("--kv-unavailable-timeout-s", "inf", "must be a finite number > 0"),
        ("--kv-unavailable-timeout-s", "1e12", "must be at most 3600"),
        ("--max-num-seqs", "-1", "must be > 0"),
        ("--num-threads", "-1", "must be >= 0"),
        ("--max-num-batched-tokens", "many", "invalid int value: 'many'"),
        ("--attention-backend", "fast", "invalid choice: 'fast'"),
        ("--metrics-port", "70000", "must be in 1..65535 (or 0: off)"),
    ],
)
def test_a_layer_refuses_a_value_its_declaration_refuses(
    flag: str, text: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        layer_config("scheduler", [*required_words("scheduler"), flag, text])
    assert info.value.code == 2
    assert f"zerolayer scheduler: error: argument {flag}: {reason}" in capsys.readouterr().err


def test_the_frontend_refuses_a_listen_address_grpc_cannot_bind(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        layer_config("frontend", [*required_words("frontend"), "--listen", "::1:50051"])
    err = capsys.readouterr().err
    assert "argument --listen: '::1:50051': an IPv6 address goes in brackets, [::1]:PORT" in err


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("kv_cache_bytes", 0, "--kv-cache-bytes: must be > 0"),
        ("max_num_batched_tokens", -5, "--max-num-batched-tokens: must be > 0"),
        (
            "kv_unavailable_timeout_s",
            float("nan"),
            "--kv-unavailable-timeout-s: must be a finite number > 0",
        ),
        ("owner_lease_s", float("inf"), "--owner-lease-s: must be a finite number > 0"),
        ("owner_lease_s", 1e12, "--owner-lease-s: must be at most 3600"),
        ("owner_lease_s", 3600.5, "--owner-lease-s: must be at most 3600"),
        ("scheduler_wait_s", 1e12, "--scheduler-wait-s: must be at most 3600"),
        ("failover_wait_s", 1e12, "--failover-wait-s: must be at most 3600"),
        ("kv_unavailable_timeout_s", 1e12, "--kv-unavailable-timeout-s: must be at most 3600"),
        ("default_max_new_tokens", 2**32, "--default-max-new-tokens: must be at most 4294967295"),
        ("default_max_new_tokens", 0, "--default-max-new-tokens: must be > 0"),
        ("metrics_port_base", 65533, "--metrics-port-base: must be in 1..65532 (or 0: off)"),
        ("metrics_port_base", -1, "--metrics-port-base: must be in 1..65532 (or 0: off)"),
        ("routing", "fastest", "--routing: 'fastest' is not one of least-work, prefix-affine"),
    ],
)
def test_stack_config_checks_a_value_by_its_declaration(field, bad, message) -> None:
    with pytest.raises(ValueError) as info:
        StackConfig(model_dir="/m", **{field: bad})
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("setting_value", "argv"),
    [(64, []), (8, ["--max-num-seqs", "8"])],
)
def test_a_setting_at_its_default_takes_no_words(setting_value: int, argv: list[str]) -> None:
    assert MAX_NUM_SEQS.argv(setting_value) == argv


def many(default: object = REQUIRED) -> Setting:
    """A repeatable setting of the frontend (like ``--scheduler``), with ``default``."""
    return Setting("addresses", "--address-list", "addresses", default, multiple=True)


def parse_many(setting: Setting, argv: list[str]) -> object:
    parser = argparse.ArgumentParser(exit_on_error=False)
    setting.add_to(parser)
    return getattr(parser.parse_args(argv), setting.name)


def test_a_multiple_setting_adds_up_repeated_flags_and_comma_lists() -> None:
    argv = ["--address-list", "a", "--address-list", "b, c"]
    assert parse_many(many(), argv) == ("a", "b", "c")
    assert parse_many(many(), ["--address-list", "unix:/x.sock"]) == ("unix:/x.sock",)
    # The first occurrence replaces a default; none keeps it.
    assert parse_many(many(("d", "e")), ["--address-list", "a"]) == ("a",)
    assert parse_many(many(("d", "e")), []) == ("d", "e")
    assert many(("d", "e")).help_text() == "addresses (default d,e)"


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--address-list", "a,,b"], "'a,,b' has an empty item"),
        (["--address-list", "a", "--address-list", "b,a"], "'a' given twice"),
    ],
)
def test_a_multiple_setting_refuses_empty_and_repeated_items(argv, reason) -> None:
    with pytest.raises(argparse.ArgumentError) as info:
        parse_many(many(), argv)
    assert str(info.value) == f"argument --address-list: {reason}"


def test_a_multiple_setting_checks_each_item_and_gives_each_its_flag() -> None:
    setting = Setting("ports", "--ports", "ports", (1,), int, positive, multiple=True)
    assert parse_many(setting, ["--ports", "2,3"]) == (2, 3)
    with pytest.raises(argparse.ArgumentError, match="must be > 0"):
        parse_many(setting, ["--ports", "2,0"])
    with pytest.raises(ValueError, match="^--ports: must be > 0$"):
        setting.validate((2, 0))
    assert setting.argv((2, 3)) == ["--ports", "2", "--ports", "3"]
    assert setting.argv((1,)) == []
    assert many().argv("unix:/one.sock") == ["--address-list", "unix:/one.sock"]


def test_the_frontend_takes_one_scheduler_as_before_or_several() -> None:
    one = layer_config("frontend", ["--loader", "l", "--scheduler", "unix:/s.sock"])
    assert one.scheduler_address == ("unix:/s.sock",)
    several = ["--loader", "l", "--scheduler", "unix:/s.sock", "--scheduler", "unix:/t.sock"]
    assert layer_config("frontend", several).scheduler_address == ("unix:/s.sock", "unix:/t.sock")
    assert FrontendConfig(loader_address="l", scheduler_address="s").scheduler_address == ("s",)


def test_a_lease_in_milliseconds_fits_the_kvstores_uint32_field_at_the_bound() -> None:
    assert StackConfig(model_dir="/m", owner_lease_s=3600).owner_lease_s == 3600
    assert round(OWNER_LEASE_S.check.maximum * 1000) <= 2**32 - 1


def test_at_most_checks_the_lower_end_first_and_shows_the_bound_in_help() -> None:
    setting = Setting("wait_s", "--wait-s", "a wait", 2.0, check=AtMost(positive, 60), unit="s")
    setting.validate(60)
    with pytest.raises(ValueError, match="^--wait-s: must be > 0$"):
        setting.validate(0.0)
    with pytest.raises(ValueError, match="^--wait-s: must be at most 60$"):
        setting.validate(60.5)
    assert setting.help_text() == "a wait (s; at most 60; default 2.0)"


def test_positive_takes_an_int_too_large_for_a_float() -> None:
    positive(10**400)
