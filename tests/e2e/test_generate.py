"""End to end on the shared stack (tests/e2e/stack.py: the tiny dummy model with a chat
template): the four real processes, real gRPC, real shm. Stopping and killing layers, and the
served model name: tests/e2e/test_restarts.py."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import grpc
import pytest
import torch
from e2e.stack import generate_ids, kv_stats, scheduler_stats, text_stub
from factories import MAX_NEW_TOKENS, generate, make_generate_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from zerolayer.bench.inprocess import local_engine_for_stack
from zerolayer.frontend.text.tokenizer import TextTokenizer
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc

pytestmark = pytest.mark.e2e

PROMPTS = [[1, 72, 101, 108, 108, 111], [1, *range(3, 60)], [1, 50, 60], [1, *[80] * 33]]


@pytest.fixture(scope="module")
def model_dir(shared_stack) -> Path:
    return shared_stack.model_dir


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.stack


@pytest.fixture(scope="module")
def stub(stack):
    return text_stub(stack)


def wait_all_blocks_free(stack, timeout_s: float = 10.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = kv_stats(stack)
        if stats.num_blocks_used == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_unary_generate_returns_tokens_and_usage(stub) -> None:
    response = stub.Generate(
        make_generate_request(prompt="Hello", ignore_eos=True, request_id="r1")
    )
    assert len(response.token_ids) == 8
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.usage.prompt_tokens == 6  # BOS + 5 bytes
    assert response.usage.completion_tokens == 8
    assert response.request_id == "r1"


def test_greedy_is_deterministic(stub) -> None:
    request = make_generate_request(prompt="determinism", max_new_tokens=12, ignore_eos=True)
    first, second = stub.Generate(request), stub.Generate(request)
    assert list(first.token_ids) == list(second.token_ids)
    assert first.text == second.text


def test_stream_concatenates_to_unary(stub) -> None:
    request = make_generate_request(prompt="stream me", max_new_tokens=20, ignore_eos=True)
    unary = stub.Generate(request)
    parts = list(stub.GenerateStream(request))
    assert "".join(p.text for p in parts) == unary.text
    assert [t for p in parts for t in p.token_ids] == list(unary.token_ids)
    assert all(p.finish_reason == pb.FINISH_REASON_UNSPECIFIED for p in parts[:-1])
    assert not any(p.HasField("usage") for p in parts[:-1])
    assert parts[-1].finish_reason == unary.finish_reason
    assert parts[-1].usage == unary.usage


def test_seeded_sampling_repeats(stub) -> None:
    request = make_generate_request(
        prompt="seed", temperature=1.0, top_p=0.9, seed=1234, max_new_tokens=16, ignore_eos=True
    )
    assert list(stub.Generate(request).token_ids) == list(stub.Generate(request).token_ids)


def test_seeded_sampled_bytes_stream_as_unary_and_as_the_full_decode(stub, model_dir) -> None:
    # Sampling a random model emits byte tokens that are not valid UTF-8; both answers render
    # them as the tokenizer's decode of the generated ids does (after a BOS-only prompt).
    request = make_generate_request(
        ids=[1],
        temperature=1.0,
        seed=7,
        max_new_tokens=48,
        ignore_eos=True,
        stop=["\ufffd\ufffd\ufffd"],
    )
    unary = stub.Generate(request)
    parts = list(stub.GenerateStream(request))
    assert "".join(p.text for p in parts) == unary.text
    assert [t for p in parts for t in p.token_ids] == list(unary.token_ids)
    tokenizer = TextTokenizer.from_json((model_dir / "tokenizer.json").read_text())
    full = tokenizer.decode(unary.token_ids)
    assert "\ufffd" in full
    assert unary.text == full.split("\ufffd\ufffd\ufffd")[0]


def test_greedy_ids_equal_transformers(stub, model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for ids in PROMPTS:
        response = stub.Generate(make_generate_request(ids=ids, max_new_tokens=16, ignore_eos=True))
        expected = hf.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=16, min_new_tokens=16
        )[0, len(ids) :].tolist()
        assert list(response.token_ids) == expected
        assert response.usage.prompt_tokens == len(ids)  # token ids are used as given


def test_the_in_process_engine_gives_the_stacks_greedy_ids(stack, stub) -> None:
    # The scheduler process and zerolayer.bench.inprocess assemble their engines with the same
    # factory (zerolayer.scheduler.engine_factory) from the same settings; one request at a
    # time, under a cache salt no other test uses, both then compute the same steps.
    engine = local_engine_for_stack(stack.config)
    in_process = [generate(engine, [ids], tag=f"p{i}-")[0] for i, ids in enumerate(PROMPTS)]
    served = [
        list(generate_ids(stub, ids, MAX_NEW_TOKENS, "in-process").token_ids) for ids in PROMPTS
    ]
    assert [len(ids) for ids in served] == [MAX_NEW_TOKENS] * len(PROMPTS)
    assert served == in_process
    assert scheduler_stats(stack).attention_backend == engine.stats().attention_backend


def test_sixteen_concurrent_streams_finish_and_free_every_block(stack, stub) -> None:
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            request = make_generate_request(
                ids=[1, 10 + i, 20 + i, *range(30, 30 + i)], ignore_eos=True, max_new_tokens=24
            )
            results[i] = [t for part in stub.GenerateStream(request) for t in part.token_ids]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(results) == list(range(16))
    assert all(len(ids) == 24 for ids in results.values())
    stats = wait_all_blocks_free(stack)
    assert stats.num_blocks_free == stats.num_blocks_total
    assert scheduler_stats(stack).num_blocks_held == 0


def test_cancelled_stream_frees_its_blocks(stack, stub) -> None:
    call = stub.GenerateStream(
        make_generate_request(prompt="cancel me", max_new_tokens=1500, ignore_eos=True)
    )
    next(call)
    next(call)
    assert kv_stats(stack).num_blocks_used > 0
    call.cancel()
    assert wait_all_blocks_free(stack).num_blocks_used == 0
    stats = scheduler_stats(stack)
    assert (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0)
    assert (stats.attention_backend, stats.num_cuda_graphs) == ("native", 0)


def test_n_samples_stream_with_their_index_and_equal_separate_seeded_requests(stub) -> None:
    fields = {"prompt": "three samples", "temperature": 1.0, "max_new_tokens": 12}
    separate = [
        stub.Generate(make_generate_request(**fields, seed=42 + i, ignore_eos=True))
        for i in range(3)
    ]
    parts = list(
        stub.GenerateStream(make_generate_request(**fields, seed=42, ignore_eos=True, n=3))
    )
    assert sorted({p.index for p in parts}) == [0, 1, 2]
    for i, alone in enumerate(separate):
        sample = [p for p in parts if p.index == i]
        assert [t for p in sample for t in p.token_ids] == list(alone.token_ids)
        assert "".join(p.text for p in sample) == alone.text
        assert sample[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert [p.HasField("usage") for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].usage.prompt_tokens == separate[0].usage.prompt_tokens
    assert parts[-1].usage.completion_tokens == 36
    unary = stub.Generate(make_generate_request(**fields, seed=42, ignore_eos=True, n=3))
    assert [(c.index, c.text, list(c.token_ids)) for c in unary.choices] == [
        (i, alone.text, list(alone.token_ids)) for i, alone in enumerate(separate)
    ]
    assert (unary.text, unary.usage.completion_tokens) == (separate[0].text, 36)
    assert not stub.Generate(make_generate_request(**fields, seed=42, ignore_eos=True)).choices


def test_a_stop_string_ends_only_the_sample_it_appears_in(stack, stub) -> None:
    fields = {"prompt": "stop one", "temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}
    separate = [stub.Generate(make_generate_request(**fields, seed=7 + i)).text for i in range(3)]
    stop = next(
        separate[1][i : i + 3]
        for i in range(1, len(separate[1]) - 3)
        if all(separate[1][i : i + 3] not in separate[j] for j in (0, 2))
    )
    parts = list(stub.GenerateStream(make_generate_request(**fields, seed=7, n=3, stop=[stop])))
    texts = ["".join(p.text for p in parts if p.index == i) for i in range(3)]
    assert texts == [separate[0], separate[1].split(stop)[0], separate[2]]
    reasons = [[p.finish_reason for p in parts if p.index == i][-1] for i in range(3)]
    assert reasons == [pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH]
    completion = parts[-1].usage.completion_tokens
    assert completion == sum(len(p.token_ids) for p in parts) < 48
    # The stopped sample ends in the scheduler too; the others go on.
    long = make_generate_request(**{**fields, "max_new_tokens": 1500}, seed=7, n=2, stop=[stop])
    call = stub.GenerateStream(long)
    assert any(p.finish_reason == pb.FINISH_REASON_STOP for p in call if p.index == 1)
    deadline = time.monotonic() + 10
    while scheduler_stats(stack).num_running != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert scheduler_stats(stack).num_running == 1
    call.cancel()


def test_cancelled_stream_of_n_samples_frees_every_block(stack, stub) -> None:
    call = stub.GenerateStream(
        make_generate_request(prompt="cancel us", max_new_tokens=1500, ignore_eos=True, n=3)
    )
    indexes = {next(call).index for _ in range(6)}
    assert indexes == {0, 1, 2}
    assert scheduler_stats(stack).num_running == 3
    call.cancel()
    assert wait_all_blocks_free(stack).num_blocks_used == 0
    stats = scheduler_stats(stack)
    assert (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0)


def test_deadline_aborts_the_request(stack, stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(
            make_generate_request(prompt="slow", max_new_tokens=1500, ignore_eos=True), timeout=0.3
        )
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_all_blocks_free(stack).num_blocks_used == 0


@pytest.mark.parametrize(
    ("fields", "code", "field_name"),
    [
        ({"prompt": ""}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        ({"ids": []}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        ({"ids": [1, 100000]}, grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids"),
        ({"prompt": "x" * 3000}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        ({"prompt": "hi", "temperature": -1.0}, grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
        ({"prompt": "hi", "top_p": 0.0}, grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        ({"prompt": "hi", "stop": [""]}, grpc.StatusCode.INVALID_ARGUMENT, "stop[0]"),
        ({"prompt": "hi", "cache_salt": "s" * 300}, grpc.StatusCode.INVALID_ARGUMENT, "cache_salt"),
        ({"prompt": "hi", "model": "gpt-9"}, grpc.StatusCode.NOT_FOUND, "model"),
        (
            {"prompt": "hi", "request_id": "a\nb\x00c"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "request_id",
        ),
    ],
)
def test_bad_requests_get_a_status_naming_the_field(stub, fields, code, field_name) -> None:
    for method in (stub.Generate, lambda r: list(stub.GenerateStream(r))):
        with pytest.raises(grpc.RpcError) as info:
            method(make_generate_request(**dict(fields)))
        assert info.value.code() == code
        assert info.value.details().startswith(field_name)


def call_raw(address: str, method: str, raw: bytes, stream: bool) -> grpc.RpcError:
    """The error a call of ``method`` with ``raw`` as its request bytes ends with."""
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            if stream:
                list(channel.unary_stream(method)(raw, timeout=10))
            else:
                channel.unary_unary(method)(raw, timeout=10)
    return info.value


def test_requests_that_do_not_parse_are_invalid_argument_in_every_layer(stack) -> None:
    bad_utf8 = bytes.fromhex("0a0341fffe")  # field 1 (a string) = b"A\xff\xfe"
    cases = [  # layer, method, request bytes, streaming response, request type
        ("frontend", "TextGeneration/Generate", b"\xff\xff\xff\xff", False, "GenerateRequest"),
        ("frontend", "TextGeneration/Generate", bad_utf8, False, "GenerateRequest"),
        ("frontend", "TextGeneration/GenerateStream", b"\x0a\x05ab", True, "GenerateRequest"),
        ("frontend", "TextGeneration/Tokenize", bad_utf8, False, "TokenizeRequest"),
        ("scheduler", "Scheduler/Generate", bad_utf8, True, "EngineRequest"),
        ("kvstore", "KVStore/GetStats", b"\xff\xff", False, "GetStatsRequest"),
    ]
    logs = {layer: Path(stack.config.log_dir) / f"{layer}.log" for layer, *_ in cases}
    before = {layer: len(path.read_bytes()) for layer, path in logs.items()}
    for layer, method, raw, stream, message_type in cases:
        address = stack.config.listen if layer == "frontend" else stack.address(layer)
        error = call_raw(address, f"/zerolayer.v1.{method}", raw, stream)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, error.details())
        assert error.details().startswith(
            f"request: could not be parsed as zerolayer.v1.{message_type}: "
        )
    time.sleep(0.2)
    for layer, path in logs.items():
        new_lines = path.read_bytes()[before[layer] :].decode().splitlines()
        assert not [line for line in new_lines if " ERROR " in line or "Traceback" in line]
        warnings = [line for line in new_lines if " WARNING " in line]
        assert len(warnings) == sum(case[0] == layer for case in cases), warnings
    # Well-formed calls still work.
    assert (
        len(
            text_stub(stack).Generate(make_generate_request(prompt="ok", ignore_eos=True)).token_ids
        )
        == 8
    )


def test_tokenize_and_model_info(stub, stack) -> None:
    tokens = stub.Tokenize(pb.TokenizeRequest(text="hi", add_special_tokens=True))
    assert list(tokens.token_ids) == [1, 107, 108]
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.architecture == "LlamaForCausalLM"
    assert (info.vocab_size, info.max_model_len, list(info.eos_token_ids)) == (259, 2048, [2])
    assert info.block_size == 16
    assert info.has_chat_template  # the shared stack's model has one; one without: test_restarts
    assert info.dtype == "float32"  # torch's name, as the proto documents (not safetensors' F32)
    assert info.model == Path(stack.config.model_dir).name  # no --served-model-name


def test_health_and_reflection(stack) -> None:
    with grpc.insecure_channel(stack.config.listen) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        response = health.Check(
            health_pb2.HealthCheckRequest(service="zerolayer.v1.TextGeneration")
        )
        assert response.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        answer = next(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        )
        names = {s.name for s in answer.list_services_response.service}
        assert {"zerolayer.v1.TextGeneration", "grpc.health.v1.Health"} <= names


def test_run_dir_is_private(stack) -> None:
    assert stack.run_dir.stat().st_mode & 0o777 == 0o700
    assert Path(stack.shm_path).exists()


def test_a_request_over_the_public_message_limit_is_resource_exhausted(stack) -> None:
    from zerolayer.frontend.__main__ import PUBLIC_MAX_RECEIVE_BYTES

    big = 1 << 30
    options = [("grpc.max_send_message_length", big), ("grpc.max_receive_message_length", big)]
    with grpc.insecure_channel(stack.config.listen, options=options) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        with pytest.raises(grpc.RpcError) as over:
            stub.Generate(
                make_generate_request(prompt="b" * (PUBLIC_MAX_RECEIVE_BYTES + 1024)), timeout=30
            )
        assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Just under the limit the message is read, and the prompt's own limit answers.
        with pytest.raises(grpc.RpcError) as under:
            stub.Generate(
                make_generate_request(prompt="b" * (PUBLIC_MAX_RECEIVE_BYTES - 1024)), timeout=30
            )
        assert under.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def frontend_log_since(stack, start: int) -> str:
    """What the frontend logged from byte ``start`` on."""
    return (Path(stack.config.log_dir) / "frontend.log").read_bytes()[start:].decode()


def frontend_log_size(stack) -> int:
    return (Path(stack.config.log_dir) / "frontend.log").stat().st_size


def test_many_cancels_and_deadlines_leave_no_error_in_the_frontend_log(stack, stub) -> None:
    log_start = frontend_log_size(stack)
    calls = []
    for i in range(24):
        request = make_generate_request(prompt=f"cancel {i}", max_new_tokens=1500, ignore_eos=True)
        calls.append(stub.GenerateStream(request))
        calls.append(stub.GenerateStream(request, timeout=0.05 + 0.03 * (i % 8)))
    for i, call in enumerate(calls[::2]):
        try:
            for _ in range(i % 6):
                next(call)
        except grpc.RpcError:
            pass
        call.cancel()
    for call in calls[1::2]:
        with pytest.raises(grpc.RpcError):
            for _ in call:
                pass
    assert wait_all_blocks_free(stack).num_blocks_used == 0
    time.sleep(0.5)
    log = frontend_log_since(stack, log_start)
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def test_clients_that_stop_reading_then_cancel_leave_no_error_and_free_everything(
    stack, stub
) -> None:
    # Each stops reading after one message, and the server's writes soon wait on flow control
    # (a 1 KiB receive window), then cancels.
    log_start = frontend_log_size(stack)
    options = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
    request = make_generate_request(prompt="stop reading", max_new_tokens=300, ignore_eos=True)
    with grpc.insecure_channel(stack.config.listen, options=options) as channel:
        slow_reader = generation_pb2_grpc.TextGenerationStub(channel)
        calls = [slow_reader.GenerateStream(request) for _ in range(50)]
        for call in calls:
            next(call)
        time.sleep(1.0)
        for call in calls:
            call.cancel()
    assert wait_all_blocks_free(stack).num_blocks_used == 0
    stats = scheduler_stats(stack)
    assert (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0)
    time.sleep(0.5)
    log = frontend_log_since(stack, log_start)
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def test_the_scheduler_uses_every_core_with_a_short_openmp_spin(stack) -> None:
    log = (Path(stack.config.log_dir) / "scheduler.log").read_text()
    cores = len(os.sched_getaffinity(0))
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        assert f"engine started with {cores} torch threads (" in log
    else:
        assert f"engine started with {cores} torch threads (GOMP_SPINCOUNT=100 (default))" in log


def test_zerolayer_tokenize_and_info_commands(stack, capsys: pytest.CaptureFixture[str]) -> None:
    from zerolayer.cli.main import main as zerolayer_main

    address = ["--address", stack.config.listen]
    assert zerolayer_main(["tokenize", "hi", "--add-special-tokens", *address]) == 0
    assert capsys.readouterr().out == "1 107 108\n1\t'<s>'\n107\t'h'\n108\t'i'\n"
    assert zerolayer_main(["tokenize", "hi", "--json", *address]) == 0
    assert json.loads(capsys.readouterr().out) == {"token_ids": [107, 108], "tokens": ["h", "i"]}
    assert zerolayer_main(["info", "--json", *address]) == 0
    info = json.loads(capsys.readouterr().out)
    served = Path(stack.config.model_dir).name
    assert (info["model"], info["vocab_size"], info["block_size"]) == (served, 259, 16)
    assert info["eos_token_ids"] == [2] and isinstance(info["num_parameters"], int)
    assert zerolayer_main(["info", *address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"model: {served}" in lines and "architecture: LlamaForCausalLM" in lines


def test_zerolayer_generate_says_why_it_stopped_and_prints_json(
    stack, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerolayer.cli.main import main as zerolayer_main

    address = ["--address", stack.config.listen]
    expected = text_stub(stack).Generate(
        pb.GenerateRequest(prompt="hi", max_new_tokens=4, ignore_eos=True), timeout=30
    )
    assert zerolayer_main(["generate", "hi", "--max-new-tokens=4", "--ignore-eos", *address]) == 0
    out, err = capsys.readouterr()
    assert out == expected.text + "\n"
    assert err == (
        "zerolayer generate: finish_reason length; prompt_tokens 3, completion_tokens 4, "
        "cached_prompt_tokens 0\n"
    )
    argv = ["generate", "hi", "--max-new-tokens=4", "--ignore-eos", "--json", "--logprobs=1"]
    assert zerolayer_main([*argv, *address]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["finish_reason"], document["usage"]["completion_tokens"]) == (
        "FINISH_REASON_LENGTH",
        4,
    )
    assert [e["chosen"]["token_id"] for e in document["logprobs"]] == document["token_ids"]
    # A stop string at the very start: an empty answer, and the reason for it.
    first = expected.text[0]
    assert zerolayer_main(["generate", "hi", f"--stop={first}", "--ignore-eos", *address]) == 0
    out, err = capsys.readouterr()
    assert out == "\n"
    assert "finish_reason stop;" in err and "the text is empty" in err


def test_zerolayer_generate_streams_several_samples(stack, capsys) -> None:
    from zerolayer.cli.main import main as zerolayer_main

    argv = ["generate", "hi", "-n", "2", "--temperature=1", "--seed=3", "--max-new-tokens=3"]
    argv += ["--ignore-eos", "--stream", "--address", stack.config.listen]
    assert zerolayer_main(argv) == 0
    out, err = capsys.readouterr()
    headers = [line for line in out.splitlines() if line.startswith("--- sample ")]
    assert sorted(headers) == ["--- sample 0 ---", "--- sample 1 ---"]
    assert "finish_reason length, length; prompt_tokens 3, completion_tokens 6" in err
