"""One trace across the layers, and metrics that move, on the shared stack (its layers export
their spans to an OTLP/gRPC receiver in the test process)."""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from e2e.stack import scheduler_stats, text_stub
from e2e.trace_receiver import Receiver
from opentelemetry.proto.trace.v1 import trace_pb2

from zerolayer.kserve.v2 import grpc_service_pb2 as kserve_pb2
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as kserve_pb2_grpc
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
INTERNAL = trace_pb2.Span.SPAN_KIND_INTERNAL


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.stack


@pytest.fixture(scope="module")
def receiver(shared_stack) -> Receiver:
    return shared_stack.receiver


def attrs(span: trace_pb2.Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = (
            list(x.string_value for x in v.array_value.values)
            if kind == "array_value"
            else getattr(v, kind)
        )
    return out


def trace_of(
    receiver: Receiver, request_id: str, names: set[str | tuple[str, str]], timeout_s: float = 20
) -> list[tuple[str, trace_pb2.Span]]:
    """The spans of the trace whose frontend root span answered ``request_id``, once all
    ``names`` (span names, or (service, span name) pairs) arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = receiver.snapshot()
        roots = [
            s
            for _, s in spans
            if s.name == "zerolayer.v1.TextGeneration/Generate"
            and attrs(s).get("gen_ai.response.id") == request_id
        ]
        if roots:
            trace = [(svc, s) for svc, s in spans if s.trace_id == roots[0].trace_id]
            arrived = {s.name for _, s in trace} | {(svc, s.name) for svc, s in trace}
            if names <= arrived or time.monotonic() > deadline:
                return trace
        elif time.monotonic() > deadline:
            return []
        time.sleep(0.1)


def test_one_trace_across_layers_separates_loading_from_inference(stack, receiver) -> None:
    rcv = receiver
    stub = text_stub(stack)
    prompt = [1, *range(10, 60)]
    stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=prompt),
            max_new_tokens=4,
            ignore_eos=True,
            cache_salt="trace",
        )
    )
    response = stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=prompt),
            max_new_tokens=6,
            ignore_eos=True,
            cache_salt="trace",
            request_id="traced-request",
        )
    )
    wanted = {
        "tokenize",
        "queue",
        "context load",
        "prefill",
        "decode",
        "detokenize",
        "zerolayer.v1.KVStore/LookupPrefix",
    }
    # NOTE: the scheduler's SERVER span ends after its decode span, maybe in a later export.
    server = ("zerolayer-scheduler", "zerolayer.v1.Scheduler/Generate")
    trace = trace_of(rcv, "traced-request", {*wanted, server})
    by_name = {s.name: (svc, s) for svc, s in trace}
    assert wanted <= set(by_name)
    assert len({s.trace_id for _, s in trace}) == 1
    assert {svc for svc, _ in trace} >= {
        "zerolayer-frontend",
        "zerolayer-scheduler",
        "zerolayer-kvstore",
    }
    root = by_name["zerolayer.v1.TextGeneration/Generate"][1]
    assert root.kind == SERVER and not root.parent_span_id
    calls = {(svc, s.kind) for svc, s in trace if s.name == "zerolayer.v1.Scheduler/Generate"}
    assert calls == {("zerolayer-frontend", CLIENT), ("zerolayer-scheduler", SERVER)}
    kv_server = [s for svc, s in trace if svc == "zerolayer-kvstore"]
    assert kv_server and all(s.kind == SERVER for s in kv_server)
    for name in ("tokenize", "queue", "context load", "prefill", "decode", "detokenize"):
        assert by_name[name][1].kind == INTERNAL, name
    # Loading, then inference: queue < context load < prefill < decode, no overlap.
    queue, load = by_name["queue"][1], by_name["context load"][1]
    prefill, decode = by_name["prefill"][1], by_name["decode"][1]
    assert queue.end_time_unix_nano <= load.start_time_unix_nano
    assert load.end_time_unix_nano <= prefill.start_time_unix_nano
    assert prefill.end_time_unix_nano <= decode.start_time_unix_nano
    # The kvstore lookup happened inside context load.
    lookups = {
        (svc, s.kind): s for svc, s in trace if s.name == "zerolayer.v1.KVStore/LookupPrefix"
    }
    client = lookups[("zerolayer-scheduler", CLIENT)]
    assert client.parent_span_id == load.span_id
    assert lookups[("zerolayer-kvstore", SERVER)].parent_span_id == client.span_id
    # Token counts equal the response's usage.
    usage = response.usage
    assert attrs(root)["gen_ai.usage.input_tokens"] == usage.prompt_tokens == 51
    assert attrs(root)["gen_ai.usage.output_tokens"] == usage.completion_tokens == 6
    assert attrs(root)["gen_ai.usage.cache_read.input_tokens"] == usage.cached_prompt_tokens == 48
    assert attrs(load)["zerolayer.cached_tokens"] == 48
    assert attrs(load)["zerolayer.uncached_tokens"] == 3
    assert attrs(load)["zerolayer.pinned_tokens"] == 0  # nothing pinned this prompt
    assert attrs(decode)["gen_ai.usage.output_tokens"] == 6
    assert attrs(root)["gen_ai.request.model"] == Path(stack.config.model_dir).name
    assert attrs(root)["gen_ai.response.finish_reasons"] == ["length"]
    assert attrs(root)["gen_ai.operation.name"] == "text_completion"
    assert not any("db." in key for _, s in trace for key in attrs(s))


def test_scheduler_start_up_is_a_weights_loading_trace(stack, receiver) -> None:
    rcv = receiver
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        spans = rcv.snapshot()
        load = [s for svc, s in spans if s.name == "load weights" and svc == "zerolayer-scheduler"]
        if load and any(
            s.name == "zerolayer.v1.Loader/GetManifest" and svc == "zerolayer-loader"
            for svc, s in spans
        ):
            break
        time.sleep(0.1)
    # The loader's GetManifest span for the scheduler's call joined the scheduler's start-up trace.
    assert any(
        svc == "zerolayer-loader"
        and s.name == "zerolayer.v1.Loader/GetManifest"
        and s.trace_id == load[0].trace_id
        for svc, s in spans
    )
    assert attrs(load[0])["zerolayer.weight_bytes"] > 0


def scrape(stack, layer: str) -> dict[str, float]:
    port = stack.config.metrics_port(layer)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_metrics_endpoints_answer_and_move(stack) -> None:
    before = {layer: scrape(stack, layer) for layer in ("scheduler", "frontend")}
    response = text_stub(stack).Generate(
        pb.GenerateRequest(prompt="metrics", max_new_tokens=5, ignore_eos=True)
    )
    assert len(response.token_ids) == 5
    scheduler, frontend = scrape(stack, "scheduler"), scrape(stack, "frontend")
    generated = "zerolayer_scheduler_generated_tokens_total"
    assert scheduler[generated] - before["scheduler"].get(generated, 0) == 5
    assert (
        scheduler["zerolayer_scheduler_ttft_seconds_count"]
        - before["scheduler"].get("zerolayer_scheduler_ttft_seconds_count", 0)
    ) == 1
    assert (
        scheduler["zerolayer_scheduler_itl_seconds_count"]
        - before["scheduler"].get("zerolayer_scheduler_itl_seconds_count", 0)
    ) == 4
    assert scheduler["zerolayer_scheduler_step_gap_seconds_count"] >= 4
    assert scheduler['zerolayer_scheduler_page_faults_total{kind="minor"}'] > 0
    assert scheduler["zerolayer_scheduler_requests_running"] == 0
    assert scheduler["zerolayer_scheduler_kv_blocks_held"] == 0
    ok = 'zerolayer_frontend_requests_total{code="OK",method="Generate"}'
    assert frontend[ok] - before["frontend"].get(ok, 0) == 1
    assert frontend["zerolayer_frontend_ttft_seconds_count"] >= 1
    loader = scrape(stack, "loader")
    assert 0 < loader["zerolayer_loader_resident_bytes"] <= loader["zerolayer_loader_weight_bytes"]
    assert scrape(stack, "kvstore")["zerolayer_kv_blocks_capacity"] > 0
    prefixes = {
        "loader": "loader",
        "kvstore": "kv",
        "scheduler": "scheduler",
        "frontend": "frontend",
    }
    for layer, prefix in prefixes.items():  # a restart shows as a new start
        assert scrape(stack, layer)["process_start_time_seconds"] > 0, layer
        assert scrape(stack, layer)[f"zerolayer_{prefix}_serving"] == 1, layer


def test_a_request_a_stop_string_ended_is_timed_and_counted_at_the_scheduler(stack) -> None:
    stub = text_stub(stack)
    fields = {"prompt": "stop at the scheduler", "ignore_eos": True}
    text = stub.Generate(pb.GenerateRequest(**fields, max_new_tokens=16)).text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    aborted = 'zerolayer_scheduler_finished_requests_total{finish_reason="ABORT"}'
    before = scrape(stack, "scheduler")
    # The frontend matches the stop string and cancels the call: the scheduler sees an abort.
    response = stub.Generate(pb.GenerateRequest(**fields, max_new_tokens=1500, stop=[stop]))
    assert response.finish_reason == pb.FINISH_REASON_STOP
    deadline = time.monotonic() + 10
    while True:
        after = scrape(stack, "scheduler")
        moved = {name: after[name] - before[name] for name in before if name in after}
        if moved[aborted] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert moved[aborted] == 1
    assert moved["zerolayer_scheduler_ttft_seconds_count"] == 1
    assert moved["zerolayer_scheduler_e2e_seconds_count"] == 1
    assert moved["zerolayer_scheduler_generation_length_tokens_count"] == 1
    assert after["zerolayer_scheduler_serving"] == 1
    assert after["zerolayer_scheduler_kv_cache_utilization"] == 0
    assert after["zerolayer_scheduler_max_num_seqs"] > 0
    assert after["zerolayer_scheduler_max_num_batched_tokens"] > 0
    assert any(name.startswith("zerolayer_scheduler_model_info{") for name in after)


def listening_hosts(port: int) -> set[str]:
    """The local addresses on which some socket listens on TCP ``port`` (/proc/net/tcp, tcp6)."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    hosts.add(str(ipaddress.IPv4Address(raw[::-1])))
                else:  # four little-endian 32-bit words
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    hosts.add(str(ipaddress.IPv6Address(words)))
    return hosts


def test_metrics_endpoints_listen_on_loopback_only_by_default(stack) -> None:
    assert stack.config.metrics_host == "127.0.0.1"
    for name in stack.slots:
        assert listening_hosts(stack.config.metrics_port(name)) == {"127.0.0.1"}, name


def test_a_bad_request_is_counted_with_its_code(stack) -> None:
    key = 'zerolayer_frontend_requests_total{code="INVALID_ARGUMENT",method="Generate"}'
    before = scrape(stack, "frontend").get(key, 0)
    with pytest.raises(grpc.RpcError):
        text_stub(stack).Generate(pb.GenerateRequest(prompt=""))
    assert scrape(stack, "frontend")[key] - before == 1


def requests_counted(stack, before: dict[str, float]) -> dict[tuple[str, str], float]:
    """Public calls counted since ``before`` (a scrape), by (method, code)."""
    prefix = "zerolayer_frontend_requests_total{"
    now = scrape(stack, "frontend")
    counted = {}
    for key, value in now.items():
        if key.startswith(prefix) and value != before.get(key, 0):
            labels = dict(part.split("=") for part in key[len(prefix) : -1].split(","))
            counted[(labels["method"].strip('"'), labels["code"].strip('"'))] = value - before.get(
                key, 0
            )
    return counted


def wait_counted(stack, before: dict[str, float], expected: dict) -> dict:
    """The counts since ``before`` once they equal ``expected`` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while (counted := requests_counted(stack, before)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return counted


def test_deadlines_cancels_and_unparsable_requests_are_counted_with_their_code(stack) -> None:
    stub = text_stub(stack)
    slow = pb.GenerateRequest(prompt="slow", max_new_tokens=1500, ignore_eos=True)
    before = scrape(stack, "frontend")
    for call in (stub.Generate, lambda r, timeout: list(stub.GenerateStream(r, timeout=timeout))):
        with pytest.raises(grpc.RpcError) as info:
            call(slow, timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(3):  # the client leaves after the first message
        stream = stub.GenerateStream(slow)
        next(stream)
        stream.cancel()
    with grpc.insecure_channel(stack.config.listen) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/zerolayer.v1.TextGeneration/Generate")(b"\xff\xff\xff\xff")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            kserve.ModelInfer(kserve_pb2.ModelInferRequest(model_name="no-such-model"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    expected = {
        ("Generate", "DEADLINE_EXCEEDED"): 1,
        ("GenerateStream", "DEADLINE_EXCEEDED"): 1,
        ("GenerateStream", "CANCELLED"): 3,
        ("Generate", "INVALID_ARGUMENT"): 1,
        ("ModelInfer", "NOT_FOUND"): 1,  # aborted inside the KServe handler
    }
    assert wait_counted(stack, before, expected) == expected


def test_every_expired_deadline_is_counted_as_such_and_a_client_cancel_as_cancelled(stack) -> None:
    # The handler is cancelled the same way for both; telling them apart used to race with the
    # deadline's clock (1 to 2 of 20 expiries were counted CANCELLED).
    stub = text_stub(stack)
    slow = pb.GenerateRequest(prompt="slow", max_new_tokens=1500, ignore_eos=True)
    before = scrape(stack, "frontend")
    load = [stub.GenerateStream(slow, timeout=20) for _ in range(12)]
    for stream in load:
        next(stream)
    expiring = [stub.Generate.future(slow, timeout=0.3) for _ in range(20)]
    cancelled = [stub.Generate.future(slow, timeout=30) for _ in range(3)]
    time.sleep(1.0)  # their handlers run by now (a call cancelled before that is not counted)
    for call in cancelled:
        call.cancel()
    for call in expiring:
        assert call.exception().code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for stream in load:
        stream.cancel()
    expected = {
        ("Generate", "DEADLINE_EXCEEDED"): 20,
        ("Generate", "CANCELLED"): 3,
        ("GenerateStream", "CANCELLED"): 12,
    }
    assert wait_counted(stack, before, expected) == expected


def test_model_stream_infer_calls_get_a_server_span_that_roots_their_trace(stack, receiver) -> None:
    rcv = receiver
    model = text_stub(stack).GetModelInfo(pb.GetModelInfoRequest()).model
    request = kserve_pb2.ModelInferRequest(model_name=model, id="stream-span")
    request.inputs.add(
        name="text_input", datatype="BYTES", shape=[1], contents={"bytes_contents": [b"span"]}
    )
    request.inputs.add(
        name="max_tokens", datatype="INT32", shape=[1], contents={"int_contents": [3]}
    )
    started_ns = time.time_ns()  # the shared stack served other ModelStreamInfer calls before
    with grpc.insecure_channel(stack.config.listen) as channel:
        kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        (response,) = kserve.ModelStreamInfer(iter([request]), timeout=30)
    assert response.error_message == ""
    name = "inference.GRPCInferenceService/ModelStreamInfer"
    deadline, roots, calls = time.monotonic() + 20, [], []
    while time.monotonic() < deadline and not (roots and calls):
        spans = rcv.snapshot()
        roots = [
            s
            for svc, s in spans
            if s.name == name
            and svc == "zerolayer-frontend"
            and s.start_time_unix_nano >= started_ns
        ]
        calls = [
            s
            for svc, s in spans
            if s.name == "zerolayer.v1.Scheduler/Generate"
            and svc == "zerolayer-scheduler"
            and roots
            and s.trace_id == roots[0].trace_id
        ]
        time.sleep(0.1)
    (root,) = roots
    assert root.kind == SERVER and not root.parent_span_id
    assert attrs(root)["rpc.method"] == "ModelStreamInfer"
    assert [s.kind for s in calls] == [SERVER]  # the generation joined the stream's trace


def traceparent(trace_id: int) -> tuple[str, str]:
    """W3C trace context metadata of a sampled client span in trace ``trace_id``."""
    return ("traceparent", f"00-{trace_id:032x}-{CLIENT_SPAN_ID:016x}-01")


CLIENT_SPAN_ID = 0xC11E47


def test_every_span_joins_the_trace_of_the_request_or_start_up_that_caused_it(
    stack, receiver
) -> None:
    """A unary, a streaming and a KServe stream call, each sent in its own client trace and
    long enough to need a block during decode: every span they cause is in that trace; the
    engine thread's kvstore calls make no trace of their own; the start-up is one trace."""
    rcv = receiver
    stub = text_stub(stack)
    unary, stream, kserve_id = 0xA1, 0xB2, 0xC3
    new_tokens = 2 * scheduler_stats(stack).block_size  # the decode needs another block

    def request(prompt: str) -> pb.GenerateRequest:
        return pb.GenerateRequest(prompt=prompt, max_new_tokens=new_tokens, ignore_eos=True)

    stub.Generate(request("unary"), metadata=[traceparent(unary)], timeout=30)
    list(stub.GenerateStream(request("stream"), metadata=[traceparent(stream)], timeout=30))
    model = stub.GetModelInfo(pb.GetModelInfoRequest()).model
    infer = kserve_pb2.ModelInferRequest(model_name=model, id="kserve-traced")
    infer.inputs.add(
        name="text_input", datatype="BYTES", shape=[1], contents={"bytes_contents": [b"kserve"]}
    )
    infer.parameters["max_tokens"].int64_param = new_tokens
    infer.parameters["ignore_eos"].bool_param = True
    with grpc.insecure_channel(stack.config.listen) as channel:
        kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        (response,) = kserve.ModelStreamInfer(
            iter([infer]), metadata=[traceparent(kserve_id)], timeout=30
        )
    assert response.error_message == ""
    first_layer = {
        unary: "zerolayer.v1.TextGeneration/Generate",
        stream: "zerolayer.v1.TextGeneration/GenerateStream",
        kserve_id: "inference.GRPCInferenceService/ModelStreamInfer",
    }

    def by_trace() -> dict[int, list[tuple[str, trace_pb2.Span]]]:
        traces: dict[int, list[tuple[str, trace_pb2.Span]]] = {}
        for svc, s in rcv.snapshot():
            traces.setdefault(int.from_bytes(s.trace_id, "big"), []).append((svc, s))
        return traces

    def names(spans: list[tuple[str, trace_pb2.Span]]) -> list[tuple[str, str, int]]:
        return sorted((svc, s.name, s.kind) for svc, s in spans)

    kv_allocate = ("zerolayer-kvstore", "zerolayer.v1.KVStore/Allocate", SERVER)
    wanted = [
        ("zerolayer-frontend", "tokenize", INTERNAL),
        ("zerolayer-frontend", "detokenize", INTERNAL),
        ("zerolayer-scheduler", "zerolayer.v1.Scheduler/Generate", SERVER),
        ("zerolayer-scheduler", "decode", INTERNAL),
        ("zerolayer-scheduler", "zerolayer.v1.KVStore/Free", CLIENT),
        ("zerolayer-kvstore", "zerolayer.v1.KVStore/Free", SERVER),
    ]

    def whole(spans: list[tuple[str, trace_pb2.Span]], server_name: str) -> bool:
        got = names(spans)
        return (
            all(w in got for w in wanted)
            and ("zerolayer-frontend", server_name, SERVER) in got
            and got.count(kv_allocate) >= 2
        )

    # NOTE: each layer exports on its own schedule: wait until every request's trace is whole.
    deadline = time.monotonic() + 20
    while True:
        traces = by_trace()
        done = all(whole(traces.get(t, []), name) for t, name in first_layer.items())
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for trace_id, server_name in first_layer.items():
        spans = traces.get(trace_id, [])
        got = names(spans)
        for w in wanted:
            assert w in got, (hex(trace_id), w, got)
        # Admission's Allocate and at least one during decode.
        assert got.count(kv_allocate) >= 2, (hex(trace_id), got)
        # The first layer's SERVER span is the child of the client's span: no root in the trace.
        assert [s.name for _, s in spans if not s.parent_span_id] == [], got
        (server,) = [s for _, s in spans if s.name == server_name and s.kind == SERVER]
        assert server.parent_span_id == CLIENT_SPAN_ID.to_bytes(8, "big")
    # The start-up is one trace: a root span over "load weights" and "map kv arena".
    start_up = {
        s.name: s
        for svc, s in rcv.snapshot()
        if svc == "zerolayer-scheduler" and s.name in ("start-up", "load weights", "map kv arena")
    }
    assert set(start_up) == {"start-up", "load weights", "map kv arena"}
    root = start_up["start-up"]
    assert not root.parent_span_id
    assert start_up["load weights"].parent_span_id == root.span_id
    assert start_up["map kv arena"].parent_span_id == root.span_id
    assert len({s.trace_id for s in start_up.values()}) == 1
    # Every other trace is a public call's, rooted at the frontend's SERVER span: none is
    # rooted at an internal layer's call (the engine thread's CommitBlocks, Free, Allocate).
    start_up_trace = int.from_bytes(root.trace_id, "big")
    for trace_id, spans in by_trace().items():
        if trace_id in first_layer or trace_id == start_up_trace:
            continue
        roots = [(svc, s.kind) for svc, s in spans if not s.parent_span_id]
        assert roots in ([], [("zerolayer-frontend", SERVER)]), (hex(trace_id), names(spans))


def test_an_http_completion_joins_the_trace_of_its_traceparent_header(stack, receiver) -> None:
    """The OpenAI-compatible endpoint's SERVER span is the child of the caller's span, and the
    spans it causes (tokenize, the scheduler's Generate) are in that trace; the call is counted
    with the gRPC calls."""
    rcv = receiver
    counted = 'zerolayer_frontend_requests_total{code="OK",method="/v1/completions"}'
    before = scrape(stack, "frontend").get(counted, 0)
    trace_id = 0xD4
    request = urllib.request.Request(
        f"http://{stack.config.http_listen}/v1/completions",
        data=b'{"prompt": "trace me", "max_tokens": 2}',
        headers={"content-type": "application/json", "traceparent": traceparent(trace_id)[1]},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    names = {("zerolayer-frontend", "POST /v1/completions"), ("zerolayer-frontend", "tokenize")}
    names.add(("zerolayer-scheduler", "zerolayer.v1.Scheduler/Generate"))
    deadline, spans = time.monotonic() + 20, []
    while time.monotonic() < deadline:
        spans = [(svc, s) for svc, s in rcv.snapshot() if s.trace_id == trace_id.to_bytes(16)]
        if names <= {(svc, s.name) for svc, s in spans}:
            break
        time.sleep(0.1)
    assert names <= {(svc, s.name) for svc, s in spans}
    (root,) = [s for _, s in spans if s.name == "POST /v1/completions"]
    assert root.kind == SERVER and root.parent_span_id == CLIENT_SPAN_ID.to_bytes(8)
    assert attrs(root)["http.response.status_code"] == 200
    assert attrs(root)["gen_ai.usage.output_tokens"] == 2
    assert scrape(stack, "frontend")[counted] - before == 1


def latency_counts(stack) -> dict[str, float]:
    """The frontend's TTFT, ITL and e2e histograms' counts and sums, e.g. ``ttft_count``."""
    return {
        f"{name}_{part}": value
        for name in ("ttft", "itl", "e2e")
        for part in ("count", "sum")
        if (value := scrape(stack, "frontend").get(f"zerolayer_frontend_{name}_seconds_{part}"))
        is not None
    }


def http_completion(stack, stream: bool) -> None:
    body = {"prompt": "latency", "max_tokens": 5, "ignore_eos": True, "stream": stream}
    request = urllib.request.Request(
        f"http://{stack.config.http_listen}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        response.read()


def kserve_request(stack, stream: bool) -> kserve_pb2.ModelInferRequest:
    model = text_stub(stack).GetModelInfo(pb.GetModelInfoRequest()).model
    tensor = kserve_pb2.ModelInferRequest.InferInputTensor
    return kserve_pb2.ModelInferRequest(
        model_name=model,
        inputs=[
            tensor(
                name="text_input",
                datatype="BYTES",
                shape=[1],
                contents=kserve_pb2.InferTensorContents(bytes_contents=[b"latency"]),
            ),
            tensor(
                name="max_tokens",
                datatype="INT32",
                shape=[1],
                contents=kserve_pb2.InferTensorContents(int_contents=[5]),
            ),
            tensor(
                name="stream",
                datatype="BOOL",
                shape=[1],
                contents=kserve_pb2.InferTensorContents(bool_contents=[stream]),
            ),
        ],
    )


@pytest.mark.parametrize(
    ("kind", "streamed"),
    [
        ("Generate", False),
        ("GenerateStream", True),
        ("/v1/completions", False),
        ("/v1/completions stream", True),
        ("ModelInfer", False),
        ("ModelStreamInfer", True),
    ],
)
def test_latencies_are_those_the_client_sees(stack, kind, streamed) -> None:
    """A streamed call of 5 tokens records its first token and gaps between its responses; a
    unary one its one response, as both first token and end (a unary call used to record a TTFT
    and gaps per internal chunk)."""
    request = pb.GenerateRequest(prompt="latency", max_new_tokens=5, ignore_eos=True)
    before = latency_counts(stack)
    if kind == "Generate":
        text_stub(stack).Generate(request, timeout=30)
    elif kind == "GenerateStream":
        list(text_stub(stack).GenerateStream(request, timeout=30))
    elif kind.startswith("/v1/"):
        http_completion(stack, streamed)
    else:
        with grpc.insecure_channel(stack.config.listen) as channel:
            kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
            if kind == "ModelInfer":
                kserve.ModelInfer(kserve_request(stack, streamed), timeout=30)
            else:
                answers = kserve.ModelStreamInfer(iter([kserve_request(stack, streamed)]))
                assert not any(a.error_message for a in answers)
    after = latency_counts(stack)
    added = {key: after[key] - before.get(key, 0) for key in after}
    assert (added["ttft_count"], added["e2e_count"]) == (1, 1)
    if streamed:
        assert 1 <= added["itl_count"] <= 4
        assert added["ttft_sum"] < added["e2e_sum"]
    else:
        assert added.get("itl_count", 0) == 0
        assert added["ttft_sum"] == pytest.approx(added["e2e_sum"], rel=1e-6)


def test_the_frontend_says_it_serves_and_how_many_calls_are_in_flight(stack) -> None:
    """What a router or autoscaler reads: the serving gauge, and the calls in flight by method
    (gRPC and HTTP) while they run and after they end."""
    frontend = scrape(stack, "frontend")
    assert frontend["zerolayer_frontend_serving"] == 1
    stream_key = 'zerolayer_frontend_requests_in_flight{method="GenerateStream"}'
    http_key = 'zerolayer_frontend_requests_in_flight{method="/v1/completions"}'
    slow = pb.GenerateRequest(prompt="in flight", max_new_tokens=1500, ignore_eos=True)
    streams = [text_stub(stack).GenerateStream(slow, timeout=60) for _ in range(2)]
    for stream in streams:
        next(stream)
    assert scrape(stack, "frontend")[stream_key] == 2
    for stream in streams:
        stream.cancel()
    http_completion(stack, stream=True)
    deadline = time.monotonic() + 10
    while (now := scrape(stack, "frontend"))[stream_key] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (now[stream_key], now[http_key]) == (0, 0)


def test_zerolayer_health_probes_each_layer_as_kubernetes_would(stack, capsys) -> None:
    # The exec probes of deploy/kubernetes/: each internal layer on its own unix socket, the
    # frontend on its public port; a socket nobody serves fails with one line.
    from zerolayer.cli.main import main as zerolayer_main

    for layer in ("loader", "kvstore", "scheduler"):
        command = stack.command(layer)
        address = command[command.index("--address") + 1]
        assert address.startswith("unix:"), address
        assert zerolayer_main(["health", "--address", address]) == 0, layer
    listen = stack.config.listen
    assert zerolayer_main(["health", "--address", listen]) == 0
    assert zerolayer_main(["health", "--address", listen, "--alive"]) == 0
    assert capsys.readouterr().err == ""
    nowhere = f"unix:{stack.run_dir}/nobody.sock"
    assert zerolayer_main(["health", "--address", nowhere, "--timeout", "1"]) == 1
    assert capsys.readouterr().err.startswith(f"zerolayer health: {nowhere}: UNAVAILABLE")
