"""The launcher's command lines against the layers' own parsers: every setting of a
``StackConfig`` reaches the layers that declare it, and only those, at any value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from common.setting_samples import layer_config, pretend_two_gpus, value

from zerolayer.common.settings import LAYERS, SETTINGS, layer_settings
from zerolayer.stack.health_watch import HealthTarget
from zerolayer.stack.launcher import Stack, StackConfig

STACK_FIELDS = {field.name for field in dataclasses.fields(StackConfig)}
NOT_FROM_THE_LAUNCHER = {"remove_arena_on_exit", "owner_id"}
"""Layer settings the launcher never passes: it removes the arena itself when the stack stops, and
a scheduler's owner id is its default, the slot's socket address (the same across restarts)."""
PROCESSES = ["loader", "kvstore", "scheduler", "scheduler-1", "scheduler-2"]
PROCESSES += ["frontend", "frontend-1", "frontend-2"]
"""The processes of a stack at the sample values: 2 active schedulers, 1 standby, 3 frontends."""


def make_stack(**settings: object) -> Stack:
    """A stack that is never started: it only builds command lines."""
    return Stack(StackConfig(**{"model_dir": "/models/llama", **settings}))


def non_default_settings(run_dir: Path) -> dict[str, object]:
    """Every StackConfig field that is a setting, at its sample value (not its default)."""
    values = {s.name: value(s) for s in SETTINGS if s.name in STACK_FIELDS}
    return {**values, "run_dir": str(run_dir)}


def parsed_command(stack: Stack, name: str) -> dict[str, object]:
    """Process ``name``'s command line parsed by its layer's own parser, as its config's
    fields (a repeated flag as a tuple)."""
    layer = stack.slots[name].layer
    command = stack.command(name)
    assert command[1:3] == ["-m", f"zerolayer.{layer}"]
    config = layer_config(layer, command[3:])
    return {s.name: as_tuple(getattr(config, s.name)) for s in layer_settings(layer)}


def as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def expected_values(stack: Stack, name: str) -> dict[str, object]:
    """What process ``name`` should get: the config's values, its wiring, else the default."""
    config = stack.config
    wiring = stack.wiring(name)
    expected = {}
    for setting in layer_settings(stack.slots[name].layer):
        if setting.name in STACK_FIELDS:
            expected[setting.name] = getattr(config, setting.name)
        elif setting.name in wiring:
            given = wiring[setting.name]
            expected[setting.name] = setting.items(given) if setting.multiple else given
        else:
            assert setting.name in NOT_FROM_THE_LAUNCHER, setting.flag
            expected[setting.name] = setting.default
    return expected


def assert_parsed_back(stack: Stack, name: str) -> dict[str, object]:
    """Process ``name``'s command parses back to :func:`expected_values`; returns what it parsed.

    A list value (every scheduler address) is given as the flag once per item; a parser that
    takes the flag once keeps the last one (NOTE: the frontend's ``--scheduler`` until it
    becomes repeatable)."""
    got, expected = parsed_command(stack, name), expected_values(stack, name)
    for key, given in expected.items():
        if isinstance(given, tuple) and not isinstance(got[key], tuple):
            expected[key] = given[-1]
    assert got == expected
    return got


@pytest.mark.parametrize("name", PROCESSES)
def test_each_process_parses_back_every_non_default_setting_of_the_stack(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_two_gpus(monkeypatch)
    stack = make_stack(**non_default_settings(tmp_path))
    for setting_name, given in non_default_settings(tmp_path).items():
        assert getattr(stack.config, setting_name) == given, setting_name
    assert list(stack.slots) == PROCESSES
    got = assert_parsed_back(stack, name)
    for setting in layer_settings(stack.slots[name].layer):
        if setting.name in STACK_FIELDS:
            assert got[setting.name] != setting.default, setting.flag


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_parses_back_a_default_stack(layer: str, tmp_path: Path) -> None:
    stack = make_stack(run_dir=str(tmp_path))
    assert list(stack.slots) == list(LAYERS)
    assert_parsed_back(stack, layer)


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


def test_each_scheduler_and_frontend_gets_its_own_socket_role_port_and_instance(
    tmp_path: Path,
) -> None:
    stack = make_stack(
        run_dir=str(tmp_path),
        schedulers=2,
        standby_schedulers=1,
        frontends=2,
        metrics_port_base=9200,
        listen="127.0.0.1:7000",
    )
    run = f"unix:{tmp_path.resolve()}"
    common = ["--loader", f"{run}/loader.sock", "--kvstore", f"{run}/kvstore.sock"]
    assert stack.command("scheduler")[3:] == [
        "--address",
        f"{run}/scheduler.sock",
        *common,
        "--metrics-port",
        "9202",
    ]
    assert stack.command("scheduler-2")[3:] == [
        "--address",
        f"{run}/scheduler-2.sock",
        *common,
        "--standby",
        "--metrics-port",
        "9205",
    ]
    schedulers = ["scheduler", "scheduler-1", "scheduler-2"]
    assert stack.command("frontend-1")[3:] == [
        "--loader",
        f"{run}/loader.sock",
        *(word for name in schedulers for word in ("--scheduler", f"{run}/{name}.sock")),
        "--pin-kvstore",
        f"{run}/kvstore.sock",
        "--instance-id",
        f"{stack.instance_id}-1",
        "--reuse-port",
        "--private-address",
        f"{run}/frontend-1.sock",
        "--listen",
        "127.0.0.1:7000",
        "--metrics-port",
        "9206",
    ]
    ports = {name: stack.config.metrics_port(name) for name in stack.slots}
    assert ports == {
        "loader": 9200,
        "kvstore": 9201,
        "scheduler": 9202,
        "frontend": 9203,
        "scheduler-1": 9204,
        "scheduler-2": 9205,
        "frontend-1": 9206,
    }


def test_the_frontends_are_checked_alone_only_when_they_share_the_port(tmp_path: Path) -> None:
    one = make_stack(run_dir=str(tmp_path / "one"))
    assert one.health_target("frontend") == HealthTarget(
        one.config.listen, f"zerolayer.instance.{one.instance_id}", "frontend"
    )
    assert "--reuse-port" not in one.command("frontend")
    two = make_stack(run_dir=str(tmp_path / "two"), frontends=2)
    for name, instance in [("frontend", two.instance_id), ("frontend-1", f"{two.instance_id}-1")]:
        assert two.health_target(name) == HealthTarget(
            f"unix:{tmp_path / 'two' / name}.sock",
            f"zerolayer.instance.{instance}",
            "frontend",
        )
    assert two.health_target("scheduler") == HealthTarget(two.address("scheduler"), "", "scheduler")


def test_a_tls_frontend_is_checked_on_its_private_plaintext_address(tmp_path: Path) -> None:
    stack = make_stack(run_dir=str(tmp_path), tls_cert="/c.pem", tls_key="/k.pem")
    instance = f"zerolayer.instance.{stack.instance_id}"
    assert stack.health_target("frontend") == HealthTarget(
        f"unix:{tmp_path / 'frontend.sock'}", instance, "frontend"
    )
    command = stack.command("frontend")
    assert command[command.index("--tls-cert") + 1] == "/c.pem"
    assert command[command.index("--private-address") + 1] == f"unix:{tmp_path / 'frontend.sock'}"
    assert "--reuse-port" not in command


def test_a_standby_slot_restarts_with_the_role_the_supervisor_gave_it(tmp_path: Path) -> None:
    stack = make_stack(run_dir=str(tmp_path), standby_schedulers=1)
    assert (stack.standby, "--standby" in stack.command("scheduler-1")) == ({"scheduler-1"}, True)
    stack.standby = {"scheduler"}  # what a takeover leaves: scheduler-1 active
    assert "--standby" in stack.command("scheduler")
    assert "--standby" not in stack.command("scheduler-1")
