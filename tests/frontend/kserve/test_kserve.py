"""The KServe v2 / Triton gRPC API of the frontend, against the shared four-process stack: a stub
generated from our proto, and NVIDIA's own tritonclient run from its own virtual environment."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import grpc
import pytest
from e2e.stack import kv_stats, scheduler_stats, text_stub
from factories import make_infer_request, pack_bytes, text_output

from zerolayer.kserve.v2 import grpc_service_pb2 as pb
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as pb_grpc
from zerolayer.v1 import generation_pb2

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
TRITON_PYTHON = ROOT / ".venv-triton" / "bin" / "python"
TRITON_CLIENT_REQUIREMENT = "tritonclient[grpc]==2.73.0"
Tensor = pb.ModelInferRequest.InferInputTensor


DESCRIBE = """
import importlib, json, sys
module = importlib.import_module(sys.argv[1])
messages = {}
def walk(m):
    messages[m.full_name] = {
        f.name: [
            f.number, f.type, f.is_repeated,
            f.message_type.full_name if f.message_type else "",
            f.containing_oneof.name if f.containing_oneof else "",
        ]
        for f in m.fields
    }
    for nested in m.nested_types:
        walk(nested)
for m in module.DESCRIPTOR.message_types_by_name.values():
    walk(m)
service = module.DESCRIPTOR.services_by_name["GRPCInferenceService"]
rpcs = {m.name: [m.input_type.full_name, m.output_type.full_name, m.client_streaming,
                 m.server_streaming] for m in service.methods}
print(json.dumps({"messages": messages, "rpcs": rpcs}))
"""
"""Prints a generated module's GRPCInferenceService messages and RPCs as JSON (either venv)."""


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.stack


@pytest.fixture(scope="module")
def stub(stack) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(stack.config.listen))


@pytest.fixture(scope="module")
def native(stack):
    return text_stub(stack)


@pytest.fixture(scope="module")
def model(native) -> str:
    return native.GetModelInfo(generation_pb2.GetModelInfoRequest()).model


def native_text(native, prompt: str, max_new_tokens: int, stop: tuple[str, ...] = ()) -> str:
    request = generation_pb2.GenerateRequest(
        prompt=prompt, max_new_tokens=max_new_tokens, ignore_eos=True, stop=stop
    )
    return native.Generate(request, timeout=30).text


def test_server_live_ready_and_metadata(stub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest()).live is True
    assert stub.ServerReady(pb.ServerReadyRequest()).ready is True
    server = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert (server.name, server.version) == ("zerolayer", metadata.version("zerolayer"))
    assert list(server.extensions) == []


def test_model_ready_only_for_the_served_model_and_version(stub, model) -> None:
    assert stub.ModelReady(pb.ModelReadyRequest(name=model)).ready is True
    assert stub.ModelReady(pb.ModelReadyRequest(name=model, version="1")).ready is True
    assert stub.ModelReady(pb.ModelReadyRequest(name=model, version="2")).ready is False
    assert stub.ModelReady(pb.ModelReadyRequest(name="no-such-model")).ready is False


def test_model_metadata(stub, model) -> None:
    response = stub.ModelMetadata(pb.ModelMetadataRequest(name=model))
    assert (response.name, list(response.versions), response.platform) == (
        model,
        ["1"],
        "zerolayer",
    )
    inputs = {t.name: (t.datatype, list(t.shape)) for t in response.inputs}
    assert inputs["text_input"] == ("BYTES", [-1])
    assert inputs["stream"] == ("BOOL", [1])
    assert inputs["max_tokens"] == ("INT32", [1])
    assert inputs["random_seed"] == ("UINT64", [1])
    assert inputs["stop_words"] == ("BYTES", [-1])
    assert inputs["stop_token_ids"] == ("INT32", [-1])
    assert inputs["repetition_penalty"] == ("FP32", [1])
    assert inputs["guided_json"] == ("BYTES", [1])
    assert [(t.name, t.datatype, list(t.shape)) for t in response.outputs] == [
        ("text_output", "BYTES", [-1]),
        ("logprobs", "BYTES", [-1]),
        ("prompt_logprobs", "BYTES", [-1]),
    ]
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="no-such-model"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details().startswith("name: 'no-such-model' is not served")


def test_model_infer_greedy_text_equals_native_generate(stub, native, model) -> None:
    request = make_infer_request(model, "Hello", max_tokens=8, ignore_eos=True)
    response = stub.ModelInfer(request, timeout=30)
    assert text_output(response) == native_text(native, "Hello", 8)
    assert (response.model_name, response.model_version, response.id) == (model, "1", "req-1")
    assert list(response.outputs[0].shape) == [1]
    params = response.parameters
    assert params["finish_reason"].string_param == "length"
    assert (params["num_input_tokens"].int64_param, params["num_output_tokens"].int64_param) == (
        6,  # BOS + 5 bytes
        8,
    )
    assert "triton_final_response" not in params
    echoed = make_infer_request(model, "Hello", max_tokens=8, ignore_eos=True)
    echoed.inputs.append(Tensor(name="exclude_input_in_output", datatype="BOOL", shape=[1]))
    echoed.raw_input_contents.append(b"\x00")
    assert text_output(stub.ModelInfer(echoed, timeout=30)) == "Hello" + native_text(
        native, "Hello", 8
    )


def test_model_infer_typed_contents_and_batch_shape(stub, native, model) -> None:
    # TensorRT-LLM ensemble layout: [batch, 1] tensors in typed contents, its input names.
    request = pb.ModelInferRequest(model_name=model, model_version="1")
    request.inputs.extend(
        [
            Tensor(
                name="text_input",
                datatype="BYTES",
                shape=[1, 1],
                contents={"bytes_contents": [b"typed"]},
            ),
            Tensor(
                name="max_tokens", datatype="INT64", shape=[1, 1], contents={"int64_contents": [6]}
            ),
            Tensor(
                name="random_seed",
                datatype="UINT64",
                shape=[1, 1],
                contents={"uint64_contents": [7]},
            ),
            Tensor(
                name="stop_words",
                datatype="BYTES",
                shape=[1, 1],
                contents={"bytes_contents": [b""]},
            ),
            Tensor(
                name="ignore_eos", datatype="BOOL", shape=[1, 1], contents={"bool_contents": [True]}
            ),
        ]
    )
    response = stub.ModelInfer(request, timeout=30)
    assert text_output(response) == native_text(native, "typed", 6)
    assert list(response.outputs[0].shape) == [1, 1]


def test_settings_from_parameters_and_sampling_parameters_json(stub, native, model) -> None:
    # vLLM backend clients send numbers as strings, in parameters and in the JSON input.
    request = make_infer_request(model, "params")
    request.parameters["max_tokens"].string_param = "5"
    request.parameters["ignore_eos"].bool_param = True
    request.parameters["priority"].uint64_param = 1  # Triton's own parameters are ignored
    response = stub.ModelInfer(request, timeout=30)
    assert response.parameters["num_output_tokens"].int64_param == 5
    assert text_output(response) == native_text(native, "params", 5)

    reference = native_text(native, "stop here", 12)
    stop = reference[4:6]
    assert len(stop) == 2
    sampling = json.dumps(
        {"max_tokens": "12", "temperature": 0, "ignore_eos": True, "stop": [stop]}
    )
    request = make_infer_request(model, "stop here", sampling_parameters=sampling)
    response = stub.ModelInfer(request, timeout=30)
    assert response.parameters["finish_reason"].string_param == "stop"
    assert text_output(response) == native_text(native, "stop here", 12, stop=(stop,))
    # an input tensor overrides the JSON
    request = make_infer_request(model, "stop here", sampling_parameters=sampling, max_tokens=3)
    response = stub.ModelInfer(request, timeout=30)
    assert response.parameters["num_output_tokens"].int64_param == 3
    assert text_output(response) == native_text(native, "stop here", 3)


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ({"max_tokens": 4}, "text_input"),
        ({"text_input": ""}, "text_input"),
        ({"text_input": "x", "max_tokens": 4.0}, "max_tokens"),
        ({"text_input": "x", "max_tokens": -1}, "max_tokens"),
        ({"text_input": "x", "top_k": "3"}, "top_k"),
        ({"text_input": "x", "beam_width": 2}, "beam_width"),
        ({"text_input": "x", "sampling_parameters": "{"}, "sampling_parameters"),
        ({"text_input": "x", "sampling_parameters": '{"n": 2}'}, "sampling_parameters.n"),
        ({"text_input": "x", "temperature": -1.0}, "temperature"),
    ],
)
def test_bad_inputs_are_invalid_argument_naming_the_input(stub, model, inputs, field) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(make_infer_request(model, None, **inputs), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}: ")


def int64_input(name: str, value: int) -> Tensor:
    return Tensor(name=name, datatype="INT64", shape=[1], contents={"int64_contents": [value]})


@pytest.mark.parametrize(
    ("setting", "value", "field"),
    [
        ("max_tokens", 2**40, "max_tokens"),
        ("max_tokens", 2**32, "max_tokens"),
        ("top_k", 2**40, "top_k"),
        ("int64_param max_tokens", 2**40, "parameters.max_tokens"),
        ("int64_param top_k", 2**32, "parameters.top_k"),
        ("string_param seed", str(2**64), "parameters.seed"),
        ("json max_tokens", 2**40, "sampling_parameters.max_tokens"),
        ("json top_k", str(2**40), "sampling_parameters.top_k"),
        ("json seed", 2**64, "sampling_parameters.seed"),
        ("json max_tokens", 1e30, "sampling_parameters.max_tokens"),
    ],
)
def test_integers_beyond_their_field_are_invalid_argument(
    stub, model, setting, value, field
) -> None:
    request = make_infer_request(model, "x")
    kind, _, name = setting.rpartition(" ")
    if kind == "json":
        request = make_infer_request(model, "x", sampling_parameters=json.dumps({name: value}))
    elif kind:
        setattr(request.parameters[name], kind, value)
    else:
        request.inputs.append(int64_input(name, value))
        request.ClearField("raw_input_contents")
        request.inputs[0].contents.bytes_contents.append(b"x")
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    maximum = 2**64 - 1 if name == "seed" else 2**32 - 1
    assert err.value.details() == (
        f"{field}: must be an integer from 0 to {maximum}, got {int(value)}"
    )


def test_sampling_parameters_as_a_request_parameter(stub, native, model) -> None:
    sampling = json.dumps({"max_tokens": "4", "ignore_eos": True})
    request = make_infer_request(model, "param json")
    request.parameters["sampling_parameters"].string_param = sampling
    request.parameters["max_tokens"].int64_param = 9  # the JSON overrides scalar parameters
    response = stub.ModelInfer(request, timeout=30)
    assert response.parameters["num_output_tokens"].int64_param == 4
    assert text_output(response) == native_text(native, "param json", 4)
    # the input form overrides the parameter form, and scalar inputs override both
    request.inputs.append(Tensor(name="sampling_parameters", datatype="BYTES", shape=[1]))
    request.raw_input_contents.append(pack_bytes(b'{"max_tokens": 6}'))
    assert stub.ModelInfer(request, timeout=30).parameters["num_output_tokens"].int64_param == 6
    request.inputs.append(Tensor(name="max_tokens", datatype="INT32", shape=[1]))
    request.raw_input_contents.append(struct.pack("<i", 2))
    assert stub.ModelInfer(request, timeout=30).parameters["num_output_tokens"].int64_param == 2
    for value, message in [
        ("{", "parameters.sampling_parameters: not valid JSON: "),
        ("[1]", "parameters.sampling_parameters: must be a JSON object"),
        ('{"n": 2}', "parameters.sampling_parameters.n: not supported"),
        (
            '{"temperature": -1}',
            "parameters.sampling_parameters.temperature: must be a finite number >= 0, got -1.0",
        ),
        ('{"top_k": "many"}', "parameters.sampling_parameters.top_k: must be an integer >= 0"),
        (7, "parameters.sampling_parameters: must be a string parameter holding a JSON object"),
    ]:
        request = make_infer_request(model, "x")
        if isinstance(value, str):
            request.parameters["sampling_parameters"].string_param = value
        else:
            request.parameters["sampling_parameters"].int64_param = value
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(message)


def test_requests_that_do_not_parse_are_invalid_argument(stack, stub, native, model) -> None:
    bad_utf8 = bytes.fromhex("0a0341fffe")  # model_name = b"A\xff\xfe"
    expected = "request: could not be parsed as inference.ModelInferRequest: "
    with grpc.insecure_channel(stack.config.listen) as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(bad_utf8, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == expected + "String field had bad UTF-8"
        # In a request stream, the first message that does not parse ends the call.
        good = make_infer_request(model, "ok", max_tokens=3, ignore_eos=True).SerializeToString()
        stream_infer = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as err:
            list(stream_infer(iter([good, b"\xff\xff\xff\xff"]), timeout=30))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == expected + "Wire format was corrupt"
    log = (Path(stack.config.log_dir) / "frontend.log").read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    # NOTE: the good request's generation may reach the scheduler just after the call ended
    # (then it is aborted): wait until nothing is in flight for half a second, not for the first
    # moment with no block used.
    deadline, quiet_since = time.monotonic() + 10, None
    while time.monotonic() < deadline:
        sched = scheduler_stats(stack)
        busy = kv_stats(stack).num_blocks_used or sched.num_running or sched.num_waiting
        quiet_since = None if busy else quiet_since or time.monotonic()
        if quiet_since is not None and time.monotonic() - quiet_since >= 0.5:
            break
        time.sleep(0.05)
    assert kv_stats(stack).num_blocks_used == 0, (kv_stats(stack), scheduler_stats(stack))
    assert text_output(stub.ModelInfer(make_infer_request(model, "ok", max_tokens=3))) == (
        native_text(native, "ok", 3)
    )


DEEP = "[" * 200_000
"""JSON nested past Python's recursion limit."""


@pytest.mark.parametrize(
    ("form", "value", "message"),
    [
        ("input", DEEP, "sampling_parameters: not valid JSON: nested too deeply"),
        ("parameter", DEEP, "parameters.sampling_parameters: not valid JSON: nested too deeply"),
        ("stop", DEEP, "parameters.stop: must be a string or a list of strings, got '[[[["),
        (
            "input",
            '{"stop": {"a": 1}}',
            "sampling_parameters.stop: must be a string or a list of strings, got {'a': 1}",
        ),
        ("input", '{"stop": ["a", 1]}', "sampling_parameters.stop: must be a string or a list"),
    ],
)
def test_deep_json_and_non_string_stops_are_invalid_argument(
    stack, stub, model, form, value, message
) -> None:
    if form == "input":
        request = make_infer_request(model, "x", sampling_parameters=value)
    else:
        request = make_infer_request(model, "x")
        key = "sampling_parameters" if form == "parameter" else "stop"
        request.parameters[key].string_param = value
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(message)
    assert len(err.value.details()) < 200
    (response,) = stub.ModelStreamInfer(iter([request]), timeout=30)
    assert response.error_message.startswith(f"INVALID_ARGUMENT: {message}")
    log = (Path(stack.config.log_dir) / "frontend.log").read_text()
    assert "RecursionError" not in log and "Traceback" not in log, log[-3000:]


def test_malformed_raw_bytes_and_unknown_model(stub, model) -> None:
    request = make_infer_request(model, "x")
    request.raw_input_contents[0] = struct.pack("<I", 10) + b"short"
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "text_input: raw BYTES element of 10 bytes overruns the contents"
    for name, version, field in [
        ("no-such-model", "", "model_name"),
        (model, "2", "model_version"),
    ]:
        request = make_infer_request(model, "x")
        request.model_name, request.model_version = name, version
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details().startswith(f"{field}: ")


def test_stream_infer_pieces_errors_and_later_requests(stub, native, model) -> None:
    streamed = make_infer_request(model, "stream me", max_tokens=12, ignore_eos=True, stream=True)
    streamed.id = "streamed"
    broken = make_infer_request(model, None, max_tokens=4)
    broken.id = "broken"
    unknown = make_infer_request(model, "x")
    unknown.model_name, unknown.id = "no-such-model", "unknown"
    whole = make_infer_request(model, "whole", max_tokens=5, ignore_eos=True)
    whole.id = "whole"
    responses = list(stub.ModelStreamInfer(iter([streamed, broken, unknown, whole]), timeout=60))

    by_id: dict[str, list[pb.ModelStreamInferResponse]] = {}
    for response in responses:
        by_id.setdefault(response.infer_response.id, []).append(response)
    assert [r.error_message for r in by_id["broken"]] == [
        "INVALID_ARGUMENT: text_input: missing (a BYTES input holding the prompt)"
    ]
    assert [r.error_message for r in by_id["unknown"]] == [
        f"NOT_FOUND: model_name: 'no-such-model' is not served (serving {model!r})"
    ]
    pieces = by_id["streamed"]
    assert len(pieces) > 1 and all(r.error_message == "" for r in pieces)
    final = [r.infer_response.parameters["triton_final_response"].bool_param for r in pieces]
    assert final == [False] * (len(pieces) - 1) + [True]
    text = "".join(text_output(r.infer_response) for r in pieces)
    assert text == native_text(native, "stream me", 12)
    (one,) = by_id["whole"]
    assert one.infer_response.parameters["triton_final_response"].bool_param is True
    assert text_output(one.infer_response) == native_text(native, "whole", 5)


def test_leaving_a_stream_aborts_its_generations(stack, stub, model) -> None:
    request = make_infer_request(model, "cancel me", max_tokens=1500, ignore_eos=True, stream=True)
    client_done = threading.Event()

    def requests():
        yield request
        client_done.wait(30)  # keep the request side open, as a live client does

    call = stub.ModelStreamInfer(requests())
    next(call)
    next(call)
    assert kv_stats(stack).num_blocks_used > 0
    call.cancel()
    client_done.set()
    deadline = time.monotonic() + 10
    while kv_stats(stack).num_blocks_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kv_stats(stack).num_blocks_used == 0
    stats = scheduler_stats(stack)
    assert (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0)


@pytest.fixture(scope="module")
def triton_python() -> Path:
    """The official client's own environment (it needs protobuf < 7, ours has 7), created on
    first use from PyPI as an outside user would: ``.venv-triton`` beside the repo's ``.venv``."""
    if not TRITON_PYTHON.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(TRITON_PYTHON.parents[1])],
            check=True,
            timeout=120,
        )
    probe = subprocess.run(
        [str(TRITON_PYTHON), "-c", "import tritonclient.grpc"], capture_output=True, timeout=60
    )
    if probe.returncode != 0:
        subprocess.run(
            [
                str(TRITON_PYTHON),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                TRITON_CLIENT_REQUIREMENT,
            ],
            check=True,
            timeout=600,
        )
    return TRITON_PYTHON


def test_proto_matches_tritonclient_wire_definitions(triton_python: Path) -> None:
    """Every message and RPC we declare has the same field names, numbers and types as the
    definitions tritonclient ships (KServe's + Triton's upstream protos)."""
    theirs = json.loads(
        subprocess.run(
            [str(triton_python), "-c", DESCRIBE, "tritonclient.grpc.service_pb2"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    ours = json.loads(
        subprocess.run(
            [sys.executable, "-c", DESCRIBE, "zerolayer.kserve.v2.grpc_service_pb2"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            cwd=ROOT,
        ).stdout
    )
    assert len(ours["rpcs"]) == 7
    assert {k: theirs["messages"].get(k) for k in ours["messages"]} == ours["messages"]
    assert {k: theirs["rpcs"].get(k) for k in ours["rpcs"]} == ours["rpcs"]


def test_official_tritonclient(stack, native, model, triton_python: Path) -> None:
    result = subprocess.run(
        [
            str(triton_python),
            str(ROOT / "examples" / "kserve" / "triton_client.py"),
            *("--url", stack.config.listen, "--model", model),
            *("--prompt", "Triton says hi", "--max-tokens", "10"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    expected = native_text(native, "Triton says hi", 10)
    assert (summary["live"], summary["ready"], summary["model_ready"]) == (True, True, True)
    assert summary["server"] == {"name": "zerolayer", "version": metadata.version("zerolayer")}
    assert summary["infer"] == {
        "id": "infer-1",
        "model_name": model,
        "model_version": "1",
        "text": expected,
    }
    assert summary["stream"]["id"] == "stream-1"
    assert summary["stream"]["text"] == expected
    assert len(summary["stream"]["pieces"]) > 1


def test_vllm_settings_reach_generate_and_logprobs_come_back(stub, native, model) -> None:
    sampling = {
        "max_tokens": 6,
        "temperature": 0.9,
        "seed": 3,
        "presence_penalty": 0.5,
        "logit_bias": {"100": 3},
        "logprobs": 2,
        "guided_regex": "[a-z]{2,5}",
    }
    request = make_infer_request(model, "Hello", sampling_parameters=json.dumps(sampling))
    request.outputs.add(name="text_output")
    request.outputs.add(name="logprobs")
    response = stub.ModelInfer(request, timeout=30)
    outputs = {
        o.name: raw[4:].decode()
        for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }
    expected = native.Generate(
        generation_pb2.GenerateRequest(
            prompt="Hello",
            max_new_tokens=6,
            temperature=0.9,
            seed=3,
            presence_penalty=0.5,
            logit_bias={100: 3.0},
            logprobs=2,
            structured_output=generation_pb2.StructuredOutput(regex="[a-z]{2,5}"),
        ),
        timeout=30,
    )
    assert re.fullmatch("[a-z]{2,5}", outputs["text_output"])
    assert outputs["text_output"] == expected.text
    logprobs = json.loads(outputs["logprobs"])
    assert [(e["token_id"], e["token"], len(e["top_logprobs"])) for e in logprobs] == [
        (p.chosen.token_id, p.chosen.token, 2) for p in expected.logprobs
    ]
    assert [e["logprob"] for e in logprobs] == pytest.approx(
        [p.chosen.logprob for p in expected.logprobs], abs=1e-6
    )
