"""The launcher's command lines against the layers' own parsers: every setting of a
``StackConfig`` reaches the layers that declare it, and only those, at any value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from common.setting_samples import layer_config, pretend_two_gpus, value

from zerolayer.common.settings import LAYERS, SETTINGS, layer_settings
from zerolayer.stack.launcher import Stack, StackConfig

STACK_FIELDS = {field.name for field in dataclasses.fields(StackConfig)}
NOT_FROM_THE_LAUNCHER = {
    "remove_arena_on_exit",
    "owner_id",
    "scheduler_wait_s",
    "failover_wait_s",
    "routing",
}
"""Layer settings the launcher never passes (it removes the arena itself when the stack stops; a
scheduler's owner id defaults to its address; ``zerolayer up`` does not offer the frontend's
routing and failover settings yet)."""


def make_stack(**settings: object) -> Stack:
    """A stack that is never started: it only builds command lines."""
    return Stack(StackConfig(**{"model_dir": "/models/llama", **settings}))


def non_default_settings(run_dir: Path) -> dict[str, object]:
    """Every StackConfig field that is a setting, at its sample value (not its default)."""
    values = {s.name: value(s) for s in SETTINGS if s.name in STACK_FIELDS}
    return {**values, "run_dir": str(run_dir)}


def parsed_command(stack: Stack, layer: str) -> dict[str, object]:
    """``layer``'s command line parsed by its own program's parser, as its config's fields."""
    command = stack.command(layer)
    assert command[1:3] == ["-m", f"zerolayer.{layer}"]
    config = layer_config(layer, command[3:])
    return {s.name: getattr(config, s.name) for s in layer_settings(layer)}


def expected_values(stack: Stack, layer: str) -> dict[str, object]:
    """What ``layer`` should get: the config's values, the stack's wiring, else the default."""
    config = stack.config
    wiring = {
        **stack.wiring(),
        "address": stack.address(layer),
        "metrics_port": config.metrics_port(layer),
    }
    expected = {}
    for setting in layer_settings(layer):
        if setting.name in STACK_FIELDS:
            expected[setting.name] = getattr(config, setting.name)
        elif setting.name in wiring:
            given = wiring[setting.name]
            expected[setting.name] = setting.items(given) if setting.multiple else given
        else:
            assert setting.name in NOT_FROM_THE_LAUNCHER, setting.flag
            expected[setting.name] = setting.default
    return expected


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_parses_back_every_non_default_setting_of_the_stack(
    layer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_two_gpus(monkeypatch)
    stack = make_stack(**non_default_settings(tmp_path))
    for name, given in non_default_settings(tmp_path).items():
        assert getattr(stack.config, name) == given, name
    got = parsed_command(stack, layer)
    assert got == expected_values(stack, layer)
    for setting in layer_settings(layer):
        if setting.name in STACK_FIELDS:
            assert got[setting.name] != setting.default, setting.flag


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_parses_back_a_default_stack(layer: str, tmp_path: Path) -> None:
    stack = make_stack(run_dir=str(tmp_path))
    assert parsed_command(stack, layer) == expected_values(stack, layer)


def test_the_command_lines_carry_exactly_the_settings_that_differ(tmp_path: Path) -> None:
    stack = make_stack(run_dir=str(tmp_path), max_num_seqs=8, enable_prefix_caching=False)
    run = f"unix:{tmp_path.resolve()}"
    assert stack.command("scheduler")[3:] == [
        "--address",
        f"{run}/scheduler.sock",
        "--loader",
        f"{run}/loader.sock",
        "--kvstore",
        f"{run}/kvstore.sock",
        "--max-num-seqs",
        "8",
    ]
    assert stack.command("kvstore")[3:] == [
        "--address",
        f"{run}/kvstore.sock",
        "--loader",
        f"{run}/loader.sock",
        "--shm-path",
        stack.shm_path,
        "--no-prefix-caching",
    ]
