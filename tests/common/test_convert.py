"""The conversion module on exact values: what each domain form becomes on the wire and back,
unset optional fields, and the requests it refuses."""

from __future__ import annotations

import dataclasses

import pytest

from zerolayer.common import convert
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    FinishReason,
    GenerationChunk,
    ModelInfo,
    TokenizeParams,
    TokenizeResult,
    Usage,
    join_chunks,
)
from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.kv.arena_info import ArenaInfo
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.stats import PrefixHit, PrefixLookup
from zerolayer.scheduler.core.engine import EngineStats
from zerolayer.sharing.manifest import DeviceMemoryHandle, HandleKind, Residency
from zerolayer.v1 import generation_pb2, kvstore_pb2, loader_pb2

LAYOUT = ArenaLayout(
    num_layers=2, num_kv_heads=4, head_dim=8, block_size=16, dtype="BF16", num_blocks=10
)
DEVICE_MEMORY = DeviceMemoryHandle(
    kind=HandleKind.CUDA_VMM_FD,
    device="cuda:0",
    gpu_uuid="GPU-1",
    size_bytes=LAYOUT.size_bytes,
    fd_socket="/run/zl/kvstore.sock.fds",
    handle_id="arena-1",
)


def make_arena_info(**changes: object) -> ArenaInfo:
    info = ArenaInfo("a1", LAYOUT, HandleKind.MMAP_FILE, "cpu", "/dev/shm/zl.kv")
    return dataclasses.replace(info, **changes)


@pytest.mark.parametrize(
    "info",
    [
        make_arena_info(),
        make_arena_info(
            handle_kind=HandleKind.CUDA_VMM_FD,
            device="cuda:0",
            shm_path="",
            device_memory=DEVICE_MEMORY,
        ),
    ],
)
def test_arena_info_round_trips_with_its_sizes_from_the_layout(info: ArenaInfo) -> None:
    pb = convert.arena_info_to_pb(info)
    # 2 layers * K,V * 16 tokens * 4 heads * 8 dims * 2 bytes
    assert (pb.block_bytes, pb.size_bytes) == (4096, 40960)
    assert pb.HasField("device_memory") is (info.device_memory is not None)
    assert convert.arena_info_from_pb(pb) == info


def test_handle_kind_lists_unknown_kinds_are_dropped_by_the_kvstore_refused_by_the_loader() -> None:
    arena = kvstore_pb2.GetArenaRequest(accepted_handle_kinds=[3, 99, 1])
    assert convert.arena_request_from_pb(arena) == [HandleKind.CUDA_VMM_FD, HandleKind.MMAP_FILE]
    request = convert.manifest_request_to_pb([HandleKind.CUDA_IPC], model="m")
    assert convert.manifest_request_from_pb(request) == ("m", [HandleKind.CUDA_IPC])
    bad = loader_pb2.GetManifestRequest(accepted_handle_kinds=[1, 99])
    with pytest.raises(InvalidArgument, match="^accepted_handle_kinds: unknown handle kind 99$"):
        convert.manifest_request_from_pb(bad)


def test_block_calls_round_trip() -> None:
    entries = [CommitEntry(4, None, (1, 2), "salt"), CommitEntry(5, 4, (3, 4), "")]
    request = convert.commit_blocks_request_to_pb(entries)
    assert not request.blocks[0].HasField("parent_block_id")
    assert convert.commit_blocks_request_from_pb(request) == entries
    lookup = convert.lookup_prefix_request_to_pb([7, 8, 9], "t")
    assert convert.lookup_prefix_request_from_pb(lookup) == ([7, 8, 9], "t", True)
    deferred = convert.lookup_prefix_request_to_pb([7, 8, 9], "t", count_with_allocate=True)
    assert convert.lookup_prefix_request_from_pb(deferred) == ([7, 8, 9], "t", False)
    hit = convert.lookup_prefix_response_to_pb(PrefixHit([3, 1], 1), block_size=16)
    assert hit.num_cached_tokens == 32
    assert convert.lookup_prefix_response_from_pb(hit) == PrefixHit([3, 1], num_pinned_blocks=1)
    assert convert.allocate_request_from_pb(convert.allocate_request_to_pb(3)) == (3, None)
    admitting = convert.allocate_request_to_pb(2, admitted_lookup=PrefixLookup(33, 0))
    assert convert.allocate_request_from_pb(admitting) == (2, PrefixLookup(33, 0))
    assert convert.allocate_response_from_pb(convert.allocate_response_to_pb([2, 0])) == [2, 0]
    assert convert.free_request_from_pb(convert.free_request_to_pb([1, 1])) == [1, 1]
    held = convert.reconcile_request_to_pb([5, 5, 6])
    assert convert.reconcile_request_from_pb(held) == [5, 5, 6]
    assert convert.reconcile_response_from_pb(convert.reconcile_response_to_pb(2)) == 2


def test_residency_round_trips() -> None:
    residency = Residency(1000, 600, 4, 1, "cuda:0")
    assert convert.residency_from_pb(convert.residency_to_pb(residency)) == residency


def test_scheduler_stats_carry_every_engine_counter() -> None:
    counters = EngineStats(1, 2, 3, 4, 5, "native", 6)
    pb = convert.scheduler_stats_to_pb(
        counters, block_size=16, not_serving_reason="Xid 79", role=SchedulerRole.STANDBY
    )
    assert (pb.num_running, pb.num_waiting, pb.num_blocks_held, pb.num_preemptions) == (1, 2, 3, 4)
    assert (pb.num_steps, pb.attention_backend, pb.num_cuda_graphs) == (5, "native", 6)
    assert (convert.block_size_from_stats_pb(pb), pb.not_serving_reason) == (16, "Xid 79")
    assert convert.role_from_stats_pb(pb) is SchedulerRole.STANDBY


@pytest.mark.parametrize("role", [SchedulerRole.ACTIVE, SchedulerRole.STANDBY])
def test_activate_answers_round_trip(role: SchedulerRole) -> None:
    assert convert.activate_response_from_pb(convert.activate_response_to_pb(role)) is role
    assert convert.activate_request_to_pb().ListFields() == []


def test_public_answers() -> None:
    info = ModelInfo("m", "LlamaForCausalLM", 256, 512, (2, 3), None, "bfloat16", 99, 16, "f")
    pb = convert.model_info_to_pb(info)
    assert not pb.HasField("bos_token_id") and list(pb.eos_token_ids) == [2, 3]
    assert convert.model_info_to_pb(dataclasses.replace(info, bos_token_id=0)).bos_token_id == 0
    assert not pb.has_chat_template
    assert convert.model_info_to_pb(
        dataclasses.replace(info, has_chat_template=True)
    ).has_chat_template
    request = generation_pb2.TokenizeRequest(text="hi", add_special_tokens=True, model="m")
    assert convert.tokenize_request_from_pb(request) == TokenizeParams("hi", True, "m")
    response = convert.tokenize_result_to_pb(TokenizeResult((104, 105), ("h", "i")))
    assert (list(response.token_ids), list(response.tokens)) == ([104, 105], ["h", "i"])


def test_join_chunks_is_the_whole_generation() -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=3, cached_prompt_tokens=0)
    chunks = [
        GenerationChunk("r", "a", (1,)),
        GenerationChunk("r", "", (2,)),
        GenerationChunk("r", "bc", (3,), FinishReason.LENGTH, usage),
    ]
    assert join_chunks(chunks) == GenerationChunk("r", "abc", (1, 2, 3), FinishReason.LENGTH, usage)
    assert join_chunks([]) == GenerationChunk("", "", ())
    assert convert.chunk_to_pb(join_chunks([])) == generation_pb2.GenerateResponse()


def test_tools_tool_calls_and_reasoning_cross_the_public_api() -> None:
    from zerolayer.common.generation import ChatMessage, ToolCall, ToolCallDelta, ToolChoice

    call = generation_pb2.ToolCall(id="c1", name="f", arguments='{"a": 1}')
    request = generation_pb2.GenerateRequest(
        messages=generation_pb2.ChatMessages(
            messages=[
                generation_pb2.ChatMessage(
                    role="assistant", tool_calls=[call], reasoning_content="r"
                )
            ]
        ),
        tools=[generation_pb2.ToolDefinition(name="f", description="d")],
        tool_choice=generation_pb2.ToolChoice(mode="function", name="f"),
        parallel_tool_calls=False,
        chat_template_kwargs_json='{"enable_thinking": false}',
    )
    params = convert.generate_params_from_pb(request)
    assert params.messages == (
        ChatMessage(
            "assistant", "", tool_calls=(ToolCall("c1", "f", '{"a": 1}'),), reasoning_content="r"
        ),
    )
    assert params.tools[0] == dataclasses.replace(params.tools[0], name="f", description="d")
    assert params.tools[0].parameters_json == '{"type": "object"}'
    assert (params.tool_choice, params.parallel_tool_calls) == (ToolChoice("function", "f"), False)
    assert (params.chat_template_kwargs_json, params.parse_output) == (
        '{"enable_thinking": false}',
        True,
    )
    plain = convert.generate_params_from_pb(generation_pb2.GenerateRequest(prompt="p"))
    assert (plain.tool_choice, plain.parallel_tool_calls, plain.parse_output) == (None, True, False)
    chunk = GenerationChunk(
        "r",
        "",
        (),
        FinishReason.TOOL_CALLS,
        reasoning_text="t",
        tool_call_deltas=(ToolCallDelta(0, "c1", "f", "{}"),),
    )
    wire = convert.chunk_to_pb(chunk)
    assert wire.finish_reason == generation_pb2.FINISH_REASON_TOOL_CALLS
    assert (wire.reasoning_text, wire.tool_call_deltas[0].arguments) == ("t", "{}")
    assert [(d.index, d.id, d.name) for d in wire.tool_call_deltas] == [(0, "c1", "f")]
