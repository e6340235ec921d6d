"""A stack of this module's own, since its tests stop and kill layers (the supervisor restarts
them) and it needs flags of its own: the tiny dummy model without a chat template, served as
``--served-model-name tiny-llama``. What only reads runs on the shared stack
(tests/e2e/test_generate.py, test_prefix_reuse.py)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import grpc
import pytest
from e2e.stack import SHARED_MAX_NUM_BATCHED_TOKENS, kv_stats, running_stack, text_stub
from factories import make_generate_request

from zerolayer.common.status import reason_of
from zerolayer.kserve.v2 import grpc_service_pb2 as kserve_pb2
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as kserve_pb2_grpc
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc

pytestmark = pytest.mark.e2e

SERVED = "tiny-llama"
"""The stack's --served-model-name."""


@pytest.fixture(scope="module")
def stack(dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with running_stack(
        dummy_model_dir,
        tmp_path_factory.mktemp("logs"),
        max_num_batched_tokens=SHARED_MAX_NUM_BATCHED_TOKENS,
        model_name=SERVED,
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def stub(stack):
    return text_stub(stack)


def wait_all_blocks_free(stack, timeout_s: float = 10.0) -> object:
    deadline = time.monotonic() + timeout_s
    while (stats := kv_stats(stack)).num_blocks_used and time.monotonic() < deadline:
        time.sleep(0.05)
    return stats


def test_model_info_says_the_served_name_and_that_there_is_no_chat_template(stub, stack) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.model == SERVED != Path(stack.config.model_dir).name
    assert not info.has_chat_template
    for method in (stub.Generate, lambda r: list(stub.GenerateStream(r))):
        chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")])
        with pytest.raises(grpc.RpcError) as info:
            method(make_generate_request(messages=chat))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("messages: the model has no chat template")


def test_the_served_model_name_is_the_one_requests_kserve_and_the_cli_use(
    stub, stack, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerolayer.cli.main import main as zerolayer_main

    response = stub.Generate(make_generate_request(prompt="named", model=SERVED, ignore_eos=True))
    assert len(response.token_ids) == 8
    directory = Path(stack.config.model_dir).name
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(make_generate_request(prompt="named", model=directory))
    with pytest.raises(grpc.RpcError) as tokenize:
        stub.Tokenize(pb.TokenizeRequest(text="named", model=directory))
    for refused in (info.value, tokenize.value):
        assert refused.code() == grpc.StatusCode.NOT_FOUND
        assert reason_of(refused) == "model-not-found"
        assert refused.details() == f"model: {directory!r} is not served (serving {SERVED!r})"
    with grpc.insecure_channel(stack.config.listen) as channel:
        kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        metadata = kserve.ModelMetadata(kserve_pb2.ModelMetadataRequest(name=SERVED))
        assert metadata.name == SERVED
        assert kserve.ModelReady(kserve_pb2.ModelReadyRequest(name=SERVED)).ready
        assert not kserve.ModelReady(kserve_pb2.ModelReadyRequest(name=directory)).ready
    assert zerolayer_main(["info", "--json", "--address", stack.config.listen]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == SERVED
    assert zerolayer_main(["info", "--address", stack.config.listen]) == 0
    assert f"model: {SERVED}" in capsys.readouterr().out.splitlines()


def test_scheduler_stopped_is_unavailable_then_restarts_alone(stack, stub) -> None:
    others = {name: stack.processes[name].pid for name in ("loader", "kvstore", "frontend")}
    stack.stop_layer("scheduler")  # on purpose: the supervisor leaves it down
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(make_generate_request(prompt="anyone?"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details().startswith("scheduler")
    assert stub.GetModelInfo(pb.GetModelInfoRequest()).block_size == 0  # as documented
    stack.start_layer("scheduler")
    stack.wait_healthy("scheduler", time.monotonic() + 60)
    response = stub.Generate(make_generate_request(prompt="back", ignore_eos=True), timeout=30)
    assert len(response.token_ids) == 8
    assert {name: stack.processes[name].pid for name in others} == others


def test_scheduler_killed_mid_stream_is_restarted_and_the_stream_continues_on_it(
    stack, stub
) -> None:
    others = {name: stack.processes[name].pid for name in ("loader", "kvstore", "frontend")}
    old_pid = stack.processes["scheduler"].pid
    # A pin the dying scheduler makes belongs to the kvstore: it outlives its maker (issue 31).
    pinning = make_generate_request(
        ids=list(range(3, 3 + 5 * 16 + 2)),
        max_new_tokens=1,
        cache_salt="pinned-across-a-kill",
        cache_pins=[pb.CachePin(ttl_s=600)],
    )
    assert stub.Generate(pinning, timeout=60).usage.pinned_prompt_tokens == 5 * 16
    assert kv_stats(stack).num_blocks_used > 0
    # NOTE: the streams start last and the kill follows their first tokens at once: on a quiet
    # machine they finished during the pinning call (and the kill found nothing in flight).
    request = make_generate_request(prompt="doomed", max_new_tokens=200, ignore_eos=True)
    call = stub.GenerateStream(request, timeout=120)
    first = next(call)
    # n = 3: each sample goes on as a request of its own (seed + i, its tokens so far).
    samples = make_generate_request(
        prompt="doomed", max_new_tokens=64, temperature=1.0, seed=5, n=3
    )
    samples_call = stub.GenerateStream(samples, timeout=120)
    samples_first = [next(samples_call) for _ in range(3)]
    stack.processes["scheduler"].kill()  # SIGKILL: no chance to free anything
    # The frontend waits for the supervisor's restart and resubmits prompt + generated there.
    responses = [first, *call]
    samples_responses = [*samples_first, *samples_call]
    assert stack.processes["scheduler"].pid != old_pid
    token_ids = [t for r in responses for t in r.token_ids]
    undisturbed = stub.Generate(request, timeout=60)
    assert token_ids == list(undisturbed.token_ids) and len(token_ids) == 200
    assert "".join(r.text for r in responses) == undisturbed.text
    assert (responses[-1].usage.prompt_tokens, responses[-1].usage.completion_tokens) == (
        undisturbed.usage.prompt_tokens,
        200,
    )
    undisturbed_samples = stub.Generate(samples, timeout=60).choices
    for i, choice in enumerate(undisturbed_samples):
        sample = [r for r in samples_responses if r.index == i]
        assert [t for r in sample for t in r.token_ids] == list(choice.token_ids)
        assert len(choice.token_ids) == 64 and sample[-1].finish_reason == choice.finish_reason
    assert samples_responses[-1].usage.completion_tokens == 192
    again = stub.Generate(pinning, timeout=60).usage
    assert (again.cached_prompt_tokens, again.cache_write_prompt_tokens) == (5 * 16, 0)
    with grpc.insecure_channel(stack.address("kvstore")) as channel:
        released = kvstore_pb2_grpc.KVStoreStub(channel).ReleaseNamespacePins(
            kvstore_pb2.ReleaseNamespacePinsRequest(cache_salt_prefix="pinned-across-a-kill")
        )
    assert released.num_blocks == 5
    # The new scheduler reconciled with the kvstore: the dead one's blocks were freed.
    assert wait_all_blocks_free(stack).num_blocks_used == 0
    assert {name: stack.processes[name].pid for name in others} == others


def run_streams(stub, prompts: list[list[int]], on_progress=None) -> dict[int, list[int]]:
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            request = pb.GenerateRequest(
                prompt_token_ids=pb.TokenIds(ids=prompts[i]), max_new_tokens=400, ignore_eos=True
            )
            ids: list[int] = []
            for part in stub.GenerateStream(request, timeout=120):
                ids.extend(part.token_ids)
                if on_progress is not None:
                    on_progress(i, len(ids))
            results[i] = ids
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    return results


def test_kill_9_of_the_kvstore_mid_stream_changes_nothing(stack, stub, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="zerolayer.stack.launcher")
    kvstore_log = Path(stack.config.log_dir) / "kvstore.log"
    log_start = kvstore_log.stat().st_size
    restarts = stack.num_restarts["kvstore"]
    prompts = [[1, *[(i * 13 + j) % 250 + 3 for j in range(20 + 5 * i)]] for i in range(8)]
    undisturbed = run_streams(stub, prompts)
    assert kv_stats(stack).num_blocks_used == 0

    progress: dict[int, int] = {}
    killed = threading.Event()
    old_pid = stack.processes["kvstore"].pid

    def kill_when_midway(i: int, num_tokens: int) -> None:
        progress[i] = num_tokens
        if len(progress) == 8 and min(progress.values()) >= 20 and not killed.is_set():
            killed.set()
            os.kill(old_pid, 9)

    disturbed = run_streams(stub, prompts, kill_when_midway)
    assert killed.is_set()
    assert disturbed == undisturbed
    assert stack.processes["kvstore"].pid != old_pid  # the supervisor restarted it
    assert stack.num_restarts["kvstore"] == restarts + 1
    assert any("kvstore exited with code -9; restarting" in r.getMessage() for r in caplog.records)
    # The restarted kvstore rebuilt its counts from the scheduler's running sequences.
    log = kvstore_log.read_bytes()
    pattern = r"reconcile: (\d+) block\(s\) held"
    assert int(re.findall(pattern, log.decode())[0]) == 0  # the first start's
    assert max(int(m) for m in re.findall(pattern, log[log_start:].decode())) > 0
    stats = wait_all_blocks_free(stack)
    assert stats.num_blocks_used == 0 and stats.num_blocks_free == stats.num_blocks_total
    arena_files = sorted(p for p in os.listdir("/dev/shm") if p.startswith(stack.run_dir.name))
    assert arena_files == [f"{stack.run_dir.name}.kv", f"{stack.run_dir.name}.kv.json"]
