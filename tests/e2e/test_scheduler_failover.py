"""Stream failover end to end: two schedulers on one kvstore behind one frontend; ``kill -9`` of
the scheduler carrying a request mid-stream. The client sees no error and exactly the tokens and
text of an undisturbed run (greedy and seeded), health follows the schedulers, two schedulers
killed together cost a request one incident, a client's id cannot collide with a resubmission's,
and a request that schedulers died under in two separate incidents ends with one error. Each
scheduler is its own kvstore owner (its owner id is its address): a dead one's references are
released when its lease expires.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest
from e2e.stack import kv_stats, text_stub
from e2e.two_schedulers import (
    HUNG_AFTER_S,
    SCHEDULERS,
    SERVING,
    TwoSchedulers,
    start_two_schedulers,
)
from factories import make_generate_request, make_infer_request, text_output
from grpc_health.v1 import health_pb2

from zerolayer.frontend.routing.failover import INCIDENT_WINDOW_S
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as kserve_pb2_grpc
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

NUM_NEW = 400
SAMPLINGS = {"greedy": {}, "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 77}}


@pytest.fixture(scope="module")
def cluster(dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    cluster = start_two_schedulers(dummy_model_dir, tmp_path_factory.mktemp("run"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def stub(cluster: TwoSchedulers):
    return text_stub(cluster.stack)


@pytest.fixture(autouse=True)
def both_serving(cluster: TwoSchedulers, stub):
    """Each test starts with both schedulers up (restarted while nothing is in flight) and
    taking the frontend's requests."""
    dead = [name for name in SCHEDULERS if cluster.processes[name].poll() is not None]
    for name in dead:
        cluster.start(name)
    cluster.wait_health(cluster.listen, "", SERVING, 30)
    for name in dead:
        wait_until_routed_to(cluster, stub, name)


def wait_until_routed_to(cluster: TwoSchedulers, stub, name: str, timeout_s: float = 30) -> None:
    """Sends one-token requests through the frontend until scheduler ``name`` steps one: the
    frontend's health watch has seen it back (it reconnects within MAX_RETRY_S plus the
    channel's backoff), and its router picks it (the other has no outstanding tokens either)."""
    steps = cluster.stats(name).num_steps
    probe = pb.GenerateRequest(prompt="probe", max_new_tokens=1, cache_salt="probe")
    deadline = time.monotonic() + timeout_s
    while cluster.stats(name).num_steps == steps:
        assert time.monotonic() < deadline, f"the frontend sends nothing to {name}"
        stub.Generate(probe, timeout=30)


failover_request = functools.partial(make_generate_request, max_new_tokens=NUM_NEW, ignore_eos=True)
"""A public request of NUM_NEW tokens, EOS ignored (``fields`` override or add)."""


def owners(cluster: TwoSchedulers) -> dict[str, object]:
    return {o.owner_id: o for o in kv_stats(cluster.stack).owners}


def first_unique_text(text: str, start: int, length: int = 4) -> str:
    """The first substring of ``text`` from ``start`` on that occurs nowhere before it."""
    for i in range(start, len(text) - length):
        candidate = text[i : i + length]
        if "\ufffd" not in candidate and text.find(candidate) == i:
            return candidate
    raise AssertionError("no unique text in the output")


def unary_killed(cluster: TwoSchedulers, stub, request: pb.GenerateRequest):
    future = stub.Generate.future(request, timeout=120)
    cluster.kill(cluster.carrier())
    return future.result()


def stream_killed(cluster: TwoSchedulers, stub, request: pb.GenerateRequest):
    call = stub.GenerateStream(request, timeout=120)
    responses = [next(call)]
    cluster.kill(cluster.carrier())
    responses += list(call)
    return responses


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_unary_request_survives_the_death_of_its_scheduler(cluster, stub, sampling) -> None:
    request = failover_request(prompt=f"unary {sampling}", **SAMPLINGS[sampling])
    response = unary_killed(cluster, stub, request)
    undisturbed = stub.Generate(request, timeout=60)
    assert list(response.token_ids) == list(undisturbed.token_ids)
    assert len(response.token_ids) == NUM_NEW
    assert response.text == undisturbed.text
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (
        undisturbed.usage.prompt_tokens,
        NUM_NEW,
    )


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_stream_survives_the_death_of_its_scheduler(cluster, stub, sampling) -> None:
    request = failover_request(prompt=f"stream {sampling}", **SAMPLINGS[sampling])
    responses = stream_killed(cluster, stub, request)
    undisturbed = stub.Generate(request, timeout=60)
    assert [t for r in responses for t in r.token_ids] == list(undisturbed.token_ids)
    assert "".join(r.text for r in responses) == undisturbed.text
    last = responses[-1]
    assert last.finish_reason == pb.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        undisturbed.usage.prompt_tokens,
        NUM_NEW,
    )


def test_a_sampled_stream_without_a_seed_survives_the_death_of_its_scheduler(cluster, stub) -> None:
    # The frontend drew the seed (no undisturbed run to compare with): all tokens, no error.
    request = failover_request(prompt="unseeded", temperature=0.9)
    responses = stream_killed(cluster, stub, request)
    assert sum(len(r.token_ids) for r in responses) == NUM_NEW
    assert responses[-1].usage.completion_tokens == NUM_NEW


def test_a_kserve_model_infer_survives_the_death_of_its_scheduler(cluster, stub) -> None:
    model = stub.GetModelInfo(pb.GetModelInfoRequest()).model
    request = make_infer_request(model, "kserve", max_tokens=NUM_NEW, ignore_eos=True)
    with grpc.insecure_channel(cluster.listen) as channel:
        future = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(
            request, timeout=120
        )
        cluster.kill(cluster.carrier())
        response = future.result()
    undisturbed = stub.Generate(failover_request(prompt="kserve"), timeout=60)
    assert text_output(response) == undisturbed.text
    assert response.parameters["num_output_tokens"].int64_param == NUM_NEW


def test_a_stop_string_still_stops_a_stream_continued_elsewhere(cluster, stub) -> None:
    probe = stub.Generate(failover_request(prompt="stop here"), timeout=60)
    # NOTE: far into the text, so the stream is still running when its carrier is found and
    # killed, even on a loaded machine (a stop 24 characters in ended it first once in CI).
    stop = first_unique_text(probe.text, 100)
    request = failover_request(prompt="stop here", stop=[stop])
    responses = stream_killed(cluster, stub, request)
    assert "".join(r.text for r in responses) == probe.text[: probe.text.index(stop)]
    assert len(responses[0].text) < probe.text.index(stop)  # it stopped after the kill
    assert responses[-1].finish_reason == pb.FINISH_REASON_STOP


def test_the_dead_schedulers_references_are_released_and_every_block_ends_free(
    cluster, stub
) -> None:
    call = stub.GenerateStream(failover_request(prompt="release"), timeout=120)
    first = next(call)
    dead = cluster.carrier()
    owner_id = cluster.addresses[dead]
    assert owners(cluster)[owner_id].num_blocks_held > 0
    cluster.kill(dead)
    responses = [first, *call]  # continued on the other scheduler
    assert sum(len(r.token_ids) for r in responses) == NUM_NEW
    deadline = time.monotonic() + 15  # the lease, 3 s, and the kvstore's check of it
    while kv_stats(cluster.stack).num_blocks_used and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = kv_stats(cluster.stack)
    assert (stats.num_blocks_used, stats.num_blocks_free) == (0, stats.num_blocks_total)
    gone = owners(cluster)[owner_id]
    assert gone.lease_expired and gone.num_blocks_held == 0


def test_a_prefix_computed_via_one_scheduler_is_a_hit_via_the_other(cluster, stub) -> None:
    prompt = "a prefix shared by both schedulers " * 4
    served = []
    responses = []
    for _ in range(2):  # idle schedulers: ties go round robin, so the two go to different ones
        before = {name: cluster.stats(name).num_steps for name in SCHEDULERS}
        responses.append(
            stub.Generate(failover_request(prompt=prompt, max_new_tokens=4), timeout=30)
        )
        served += [n for n in SCHEDULERS if cluster.stats(n).num_steps != before[n]]
    assert len(served) == 2 and served[0] != served[1]
    assert responses[0].usage.cached_prompt_tokens == 0
    assert responses[1].usage.cached_prompt_tokens > 0
    assert list(responses[1].token_ids) == list(responses[0].token_ids)


def test_health_follows_the_schedulers_down_and_back(cluster, stub) -> None:
    assert cluster.public_health() == SERVING
    cluster.kill(SCHEDULERS[0])
    assert cluster.public_health() == SERVING  # the other one still takes requests
    cluster.kill(SCHEDULERS[1])
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    cluster.wait_health(cluster.listen, "", not_serving, 10)
    cluster.wait_health(cluster.listen, "zerolayer.v1.TextGeneration", not_serving, 10)
    # The frontend process itself is up: the launcher's name for it stays SERVING.
    cluster.wait_health(
        cluster.listen, f"zerolayer.instance.{cluster.stack.instance_id}", SERVING, 1
    )
    cluster.start(SCHEDULERS[1])
    cluster.wait_health(cluster.listen, "", SERVING, 10)
    response = stub.Generate(failover_request(prompt="back", max_new_tokens=4), timeout=30)
    assert len(response.token_ids) == 4


def test_a_request_lost_in_two_separate_incidents_ends_with_one_error(cluster, stub) -> None:
    request = failover_request(prompt="poison", request_id="poison-1", max_new_tokens=1500)
    call = stub.GenerateStream(request, timeout=120)
    next(call)
    first = cluster.carrier()
    cluster.kill(first)
    next(call)  # continued on the other one
    time.sleep(INCIDENT_WINDOW_S)  # the next death is a separate incident
    cluster.kill(cluster.carrier(exclude=first))
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "'poison-1'" in info.value.details()
    assert "2 schedulers that died in 2 separate incidents" in info.value.details()


def test_two_schedulers_killed_together_cost_a_request_one_incident(cluster, stub) -> None:
    request = failover_request(prompt="together")
    call = stub.GenerateStream(request, timeout=120)
    responses = [next(call)]
    first = cluster.carrier()
    (other,) = (name for name in SCHEDULERS if name != first)
    # NOTE: stopped, then killed: the resubmission surely reaches it before it dies.
    cluster.processes[other].send_signal(signal.SIGSTOP)
    cluster.kill(first)
    time.sleep(0.3)
    cluster.kill(other)
    cluster.start(first)  # the request waits for it (--failover-wait-s)
    responses += list(call)
    undisturbed = stub.Generate(request, timeout=60)
    assert [t for r in responses for t in r.token_ids] == list(undisturbed.token_ids)
    assert responses[-1].usage.completion_tokens == NUM_NEW


def test_a_client_id_like_a_resubmission_id_does_not_break_failover(cluster, stub) -> None:
    request = failover_request(prompt="collide", request_id="x")
    call = stub.GenerateStream(request, timeout=120)
    responses = [next(call)]
    first = cluster.carrier()
    # Another client's request, with the id "x~1", on the other scheduler (the least busy).
    other = stub.GenerateStream(
        failover_request(prompt="other", request_id="x~1", max_new_tokens=1500), timeout=120
    )
    next(other)
    cluster.carrier(exclude=first)
    cluster.kill(first)
    responses += list(call)
    other.cancel()
    undisturbed = stub.Generate(failover_request(prompt="collide"), timeout=60)
    assert [t for r in responses for t in r.token_ids] == list(undisturbed.token_ids)
    assert {r.request_id for r in responses} == {"x"}  # the client only sees its own id


def test_requests_spread_over_both_schedulers(cluster, stub) -> None:
    # Two long requests at once: least outstanding work puts the second on the idle scheduler.
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(name for name in SCHEDULERS if cluster.num_running(name) > 0)

    watcher = threading.Thread(target=watch)
    watcher.start()
    futures = [
        stub.Generate.future(failover_request(prompt=f"spread {i}"), timeout=60) for i in range(2)
    ]
    try:
        assert [len(f.result().token_ids) for f in futures] == [NUM_NEW, NUM_NEW]
    finally:
        done.set()
        watcher.join()
    assert seen == set(SCHEDULERS)


def test_schedulers_are_distinct_processes(cluster: TwoSchedulers) -> None:
    pids = {cluster.processes[name].pid for name in SCHEDULERS}
    assert len(pids) == 2
    assert all(Path(cluster.addresses[n].removeprefix("unix:")).exists() for n in SCHEDULERS)


def test_a_hung_scheduler_is_taken_out_and_its_stream_continues_elsewhere(cluster, stub) -> None:
    """A scheduler stopped with SIGSTOP keeps its connection open and its health stream goes
    quiet: the frontend's pings find it hung, its stream continues on the other one, and the
    public health says NOT_SERVING once both are hung, SERVING again once they answer."""
    request = failover_request(prompt="hung")
    call = stub.GenerateStream(request, timeout=120)
    responses = [next(call)]
    hung = [cluster.carrier()]
    try:
        cluster.processes[hung[0]].send_signal(signal.SIGSTOP)
        responses += list(call)
        undisturbed = stub.Generate(request, timeout=60)
        assert [t for r in responses for t in r.token_ids] == list(undisturbed.token_ids)
        assert cluster.public_health() == SERVING  # the other one takes requests
        hung += [name for name in SCHEDULERS if name != hung[0]]
        cluster.processes[hung[1]].send_signal(signal.SIGSTOP)
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        cluster.wait_health(cluster.listen, "", not_serving, HUNG_AFTER_S + 10)
        cluster.wait_health(cluster.listen, "inference.GRPCInferenceService", not_serving, 1)
    finally:
        for name in hung:
            cluster.processes[name].send_signal(signal.SIGCONT)
    cluster.wait_health(cluster.listen, "", SERVING, 30)
    response = stub.Generate(failover_request(prompt="answers again", max_new_tokens=4), timeout=30)
    assert len(response.token_ids) == 4
