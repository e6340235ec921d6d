"""Pins over real gRPC against a real kvstore process (next to test_main's loader): pin requests
racing for the last of a namespace's budget get exactly what fits, a lookup counts the pinned
blocks it hit, the testing clock expires pins and a namespace release ends the rest, and a kill -9
and restart (without the testing clock) drops every pin."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import grpc
import pytest
from kvstore.test_main import REPO_ROOT, kvstore_command, loader_address  # noqa: F401

from zerolayer.common.convert import (
    advance_pin_clock_request_to_pb,
    advance_pin_clock_response_from_pb,
    allocate_request_to_pb,
    commit_blocks_request_to_pb,
    free_request_to_pb,
    lookup_prefix_request_to_pb,
    pin_request_to_pb,
    reconcile_request_to_pb,
    release_namespace_pins_request_to_pb,
    release_namespace_pins_response_from_pb,
)
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.pin import PIN_OVER_NAMESPACE_BUDGET, PinsReleased
from zerolayer.kvstore.pin_clock import NOT_TESTING
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc

pytestmark = pytest.mark.e2e

BLOCK_SIZE = 16
NUM_BLOCKS = 1024
"""Blocks of a 4 MiB arena for test_main's model (checked against GetStats)."""


def start(loader: str, shm_path: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """A kvstore whose namespaces may pin 3 blocks each, with ``flags``, once it listens; and
    its log so far."""
    process = subprocess.Popen(
        [
            *kvstore_command(loader, shm_path, 4 << 20),
            "--max-pinned-fraction-per-namespace",
            str(3.5 / NUM_BLOCKS),
            *flags,
        ],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = ""
    while "listening on" not in log:
        line = process.stderr.readline()
        assert line, log
        log += line
    return process, log


def cache_prefixes(stub: kvstore_pb2_grpc.KVStoreStub, prompts: list[list[int]]) -> None:
    """Computes nothing, but commits each one-block prompt and frees it, as a finished request."""
    stub.Reconcile(reconcile_request_to_pb([]))
    block_ids = list(stub.Allocate(allocate_request_to_pb(len(prompts))).block_ids)
    entries = [
        CommitEntry(b, None, tuple(p), "tenant") for b, p in zip(block_ids, prompts, strict=True)
    ]
    assert stub.CommitBlocks(commit_blocks_request_to_pb(entries)).num_registered == len(prompts)
    stub.Free(free_request_to_pb(block_ids))


def check_lookup_clock_and_namespace_release(
    stub: kvstore_pb2_grpc.KVStoreStub, pinned_prompt: list[int], kept_pin_id: str
) -> None:
    """With three one-block pins of "tenant" (``kept_pin_id``'s of ``pinned_prompt``): a lookup's
    pinned blocks, a key too long, the testing clock expiring two pins, ReleaseNamespacePins
    ending the third."""
    hit = stub.LookupPrefix(lookup_prefix_request_to_pb([*pinned_prompt, 0], "tenant"))
    assert (len(hit.block_ids), hit.num_cached_tokens, hit.num_pinned_blocks) == (1, BLOCK_SIZE, 1)
    stub.Free(free_request_to_pb(list(hit.block_ids)))
    with pytest.raises(grpc.RpcError) as error:
        stub.Pin(pin_request_to_pb(pinned_prompt, "tenant", 60.0, False, key="k" * 257))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "key: 257 bytes, at most 256"
    longer = kvstore_pb2.RenewPinRequest(pin_id=kept_pin_id, ttl_ms=1_200_000)
    assert stub.RenewPin(longer).expires_in_ms == 1_200_000
    advanced = stub.AdvancePinClock(advance_pin_clock_request_to_pb(600.0))
    assert advance_pin_clock_response_from_pb(advanced) == 2
    assert stub.ReleaseNamespacePins(release_namespace_pins_request_to_pb("other")).num_pins == 0
    released = stub.ReleaseNamespacePins(release_namespace_pins_request_to_pb("ten"))
    assert release_namespace_pins_response_from_pb(released) == PinsReleased(1, 1)
    stats = stub.GetStats(kvstore_pb2.GetStatsRequest()).pins
    assert (len(stats.namespaces), stats.num_pins_released_by_namespace) == (0, 1)


def test_pins_race_for_a_budget_and_a_killed_kvstore_drops_them(
    loader_address: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    shm_path = tmp_path / "zl.kv"
    process, _ = start(loader_address, shm_path, "--testing-pin-clock")
    address = f"unix:{tmp_path / 'kvstore.sock'}"
    try:
        with grpc.insecure_channel(address) as channel:
            stub = kvstore_pb2_grpc.KVStoreStub(channel)
            prompts = [list(range(16 * i, 16 * i + 16)) for i in range(8)]
            cache_prefixes(stub, prompts)
            calls = [stub.Pin.future(pin_request_to_pb(p, "tenant", 600.0, True)) for p in prompts]
            answers = [call.result() for call in calls]
            pinned = [a for a in answers if a.pin_id]
            assert [(a.num_blocks, a.num_tokens) for a in pinned] == [(1, BLOCK_SIZE)] * 3
            assert {a.refusal for a in answers if not a.pin_id} == {PIN_OVER_NAMESPACE_BUDGET}
            all_stats = stub.GetStats(kvstore_pb2.GetStatsRequest())
            assert all_stats.num_blocks_total == NUM_BLOCKS
            stats = all_stats.pins
            [namespace] = stats.namespaces
            assert (namespace.cache_salt, namespace.num_pins, namespace.num_blocks_pinned) == (
                "tenant",
                3,
                3,
            )
            assert namespace.num_bytes_pinned == 3 * (4 << 20) // NUM_BLOCKS
            assert (stats.max_pinned_blocks_per_namespace, stats.num_pin_refusals) == (3, 5)
            with pytest.raises(grpc.RpcError) as error:
                stub.Pin(kvstore_pb2.PinRequest(token_ids=prompts[0], cache_salt="tenant"))
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details() == "ttl_ms: must be > 0"
            renewed = stub.RenewPin(kvstore_pb2.RenewPinRequest(pin_id=pinned[0].pin_id))
            assert (renewed.found, renewed.expires_in_ms) == (True, 600_000)
            kept_prompt = prompts[answers.index(pinned[0])]
            check_lookup_clock_and_namespace_release(stub, kept_prompt, pinned[0].pin_id)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        process, log = start(loader_address, shm_path)
        assert "pins held before the restart, if any, are dropped" in log
        with grpc.insecure_channel(address) as channel:
            stub = kvstore_pb2_grpc.KVStoreStub(channel)
            with pytest.raises(grpc.RpcError) as error:
                stub.AdvancePinClock(advance_pin_clock_request_to_pb(1.0))
            assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error.value.details() == NOT_TESTING
            assert not stub.GetStats(kvstore_pb2.GetStatsRequest()).pins.namespaces
            gone = kvstore_pb2.ReleasePinRequest(pin_id=pinned[0].pin_id)
            assert not stub.ReleasePin(gone).found
            assert stub.GetStats(kvstore_pb2.GetStatsRequest()).pins.num_pin_misses == 1
    finally:
        process.kill()
        process.wait(timeout=30)
