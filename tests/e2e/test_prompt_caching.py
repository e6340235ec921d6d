"""Prompt caching by reference, end to end (issue 31): pins asked for through the public APIs,
seen by the official clients' usage, held by the kvstore through floods of other prompts and
within the pin budget; isolated per tenant; ended by their ttl (the kvstore's testing pin clock). A
pin that outlives a kill -9 of the scheduler that made it: tests/e2e/test_restarts.py.

A stack of this module's own: a KV pool of 128 blocks (so a flood evicts everything unpinned),
tenants (a bearer token per test), and the testing pin clock.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import grpc
import openai
import pytest
from e2e.stack import (
    chat_dummy_model,
    free_port,
    kv_stats,
    running_stack,
    tenants_file,
    text_stub,
)

from zerolayer.frontend.tenants import scoped_cache_salt
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc

pytestmark = pytest.mark.e2e

BLOCK_SIZE = 16
BLOCK_BYTES = 4 * 2 * BLOCK_SIZE * 2 * 32 * 4
"""The tiny dummy model's KV block: 4 layers, K and V, 2 KV heads of 32 fp32 values a token."""
NUM_BLOCKS = 128
TENANTS = ("alice", "bob", "carol", "dave", "frank", "grace", "heidi")
"""One tenant per test (the bearer token is the name): the pin budget is a tenant's."""
TOKENS = {name: name for name in TENANTS}


def system(name: str) -> str:
    """A system prompt of about 100 tokens (the tiny model's tokenizer is byte-level), its first
    block already its own (BOS and ``<|system|>`` are 11 tokens): tests pin prompts of their
    own, which share no block with another test's."""
    return f"{name}: you are an agent. " * 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("pins")
    with running_stack(
        chat_dummy_model(tmp_path_factory),
        tmp_path_factory.mktemp("logs"),
        kv_cache_bytes=NUM_BLOCKS * BLOCK_BYTES,
        http_listen=f"127.0.0.1:{free_port()}",
        tenants=str(tenants_file(folder, TOKENS)),
        testing_pin_clock=True,
    ) as stack:
        yield stack


def openai_client(stack, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{stack.config.http_listen}/v1", api_key=token)


def chat(client: openai.OpenAI, name: str, **fields: object):
    """A chat of system prompt ``name``'s."""
    return client.chat.completions.create(
        model="dummy",
        messages=[{"role": "system", "content": system(name)}, {"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_body=fields,
    )


def grpc_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def flood(stack) -> None:
    """Distinct unpinned prompts (of tenant alice), one after another, whose blocks pass through
    the whole pool and more: every block that nothing references is evicted (LRU)."""
    stub = text_stub(stack)
    rng = random.Random()
    per_request = 24  # blocks
    for _ in range(NUM_BLOCKS // per_request + 2):
        ids = [rng.randrange(3, 250) for _ in range(per_request * BLOCK_SIZE)]
        request = pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=ids), max_new_tokens=1, ignore_eos=True
        )
        stub.Generate(request, metadata=grpc_metadata("alice"), timeout=60)


def pinning_request(ids: list[int], salt: str, ttl_s: int) -> pb.GenerateRequest:
    """A one-token Generate of ``ids`` that pins the whole prompt."""
    return pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=ids),
        max_new_tokens=1,
        ignore_eos=True,
        cache_salt=salt,
        cache_pins=[pb.CachePin(ttl_s=ttl_s)],
    )


def cached(response) -> int:
    return response.usage.prompt_tokens_details.cached_tokens


def whole_blocks_before_last(num_tokens: int) -> int:
    """What a lookup can read of a prompt: the whole blocks before its last token."""
    return (num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


def kvstore(stack) -> kvstore_pb2_grpc.KVStoreStub:
    return kvstore_pb2_grpc.KVStoreStub(grpc.insecure_channel(stack.address("kvstore")))


def advance_pin_clock(stack, seconds: float) -> int:
    answer = kvstore(stack).AdvancePinClock(
        kvstore_pb2.AdvancePinClockRequest(advance_ms=round(seconds * 1000)), timeout=5
    )
    return answer.num_expired


def test_concurrent_pins_of_one_tenant_get_exactly_its_budget(stack) -> None:
    # NOTE: first, while nothing else is pinned (the pool's budget is twice a tenant's); it
    # releases its pins at the end (as a tenant's removal does), so that later tests have the
    # pool's budget.
    stub = text_stub(stack)
    budget = kv_stats(stack).pins.max_pinned_blocks_per_namespace
    assert budget == NUM_BLOCKS // 4

    def pin_five_blocks(i: int) -> pb.Usage:
        ids = [100 + i] + [7] * (5 * BLOCK_SIZE)  # distinct from the first block on
        request = pinning_request(ids, f"salt-{i % 2}", ttl_s=60)  # one budget, two salts
        return stub.Generate(request, metadata=grpc_metadata("frank"), timeout=60).usage

    with ThreadPoolExecutor(8) as pool:
        usages = list(pool.map(pin_five_blocks, range(8)))
    made = [u for u in usages if not u.pin_refusal]
    assert len(made) == budget // 5
    assert {u.pin_refusal for u in usages} - {""} == {"pin-over-namespace-budget"}
    assert all(u.cache_write_prompt_tokens == 0 for u in usages if u.pin_refusal)
    [space] = [n for n in kv_stats(stack).pins.namespaces if n.cache_salt == "tenant:5:frank"]
    assert space.num_blocks_pinned == 5 * len(made) <= budget
    released = kvstore(stack).ReleaseNamespacePins(
        kvstore_pb2.ReleaseNamespacePinsRequest(cache_salt_prefix="tenant:5:frank"), timeout=5
    )
    assert released.num_pins == len(made)


def test_a_pinned_prompt_survives_a_flood_that_evicts_the_unpinned_one(stack) -> None:
    alice = openai_client(stack, "alice")
    first = chat(alice, "survive", prompt_cache_retention="24h", prompt_cache_key="s1")
    unpinned = chat(alice, "evicted", prompt_cache_key="s2")
    assert cached(first) == 0 and cached(unpinned) == 0
    assert cached(chat(alice, "evicted")) == whole_blocks_before_last(unpinned.usage.prompt_tokens)
    flood(stack)
    assert cached(chat(alice, "evicted")) == 0
    again = chat(alice, "survive", prompt_cache_retention="24h", prompt_cache_key="s1")
    assert cached(again) == whole_blocks_before_last(first.usage.prompt_tokens) > 0
    # The other tenant's identical prompt reads nothing of alice's namespace.
    assert cached(chat(openai_client(stack, "bob"), "survive")) == 0


def test_an_anthropic_breakpoint_survives_a_flood_and_is_read_exactly(stack) -> None:
    """The official anthropic client: a system block's ``cache_control`` pins the prompt's whole
    blocks up to it; after a flood evicts everything unpinned, the same call reads exactly what
    the first wrote (the rest of its prompt was evicted), and another tenant's identical prompt
    reads nothing."""
    url = f"http://{stack.config.http_listen}"

    def create(token: str, breakpoint: bool = True) -> anthropic.types.Message:
        client = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=60)
        # NOTE: a system prompt of one block (BOS and <|system|> are 11 tokens): the pool's pin
        # budget is shared by every test of the module.
        block = {"type": "text", "text": "anthropic agent."}
        if breakpoint:
            block["cache_control"] = {"type": "ephemeral", "ttl": "1h"}  # type: ignore[assignment]
        return client.messages.create(
            model="dummy",
            max_tokens=1,
            system=[block],  # type: ignore[list-item]
            messages=[{"role": "user", "content": "hi " * 20}],
        )

    first = create("heidi").usage
    assert (first.cache_read_input_tokens, first.cache_creation_input_tokens) == (0, BLOCK_SIZE)
    assert first.cache_creation.ephemeral_1h_input_tokens == first.cache_creation_input_tokens  # type: ignore[union-attr]
    num_prompt_tokens = first.input_tokens + first.cache_creation_input_tokens
    flood(stack)
    again = create("heidi").usage
    assert (again.cache_read_input_tokens, again.cache_creation_input_tokens) == (
        first.cache_creation_input_tokens,
        0,
    )
    assert again.cache_read_input_tokens < whole_blocks_before_last(num_prompt_tokens)
    assert create("bob", breakpoint=False).usage.cache_read_input_tokens == 0


def test_grpc_usage_says_what_was_written_and_read(stack) -> None:
    stub = text_stub(stack)
    request = pinning_request(list(range(3, 3 + 5 * BLOCK_SIZE + 3)), "grpc-usage", ttl_s=300)
    first = stub.Generate(request, metadata=grpc_metadata("carol"), timeout=60).usage
    assert (first.cached_prompt_tokens, first.pinned_prompt_tokens) == (0, 5 * BLOCK_SIZE)
    assert first.cache_write_prompt_tokens == 5 * BLOCK_SIZE and not first.pin_refusal
    second = stub.Generate(request, metadata=grpc_metadata("carol"), timeout=60).usage
    assert second.cached_prompt_tokens == 5 * BLOCK_SIZE == second.pinned_prompt_tokens
    assert second.cache_write_prompt_tokens == 0


def test_a_pin_expires_at_its_ttl(stack) -> None:
    alice = openai_client(stack, "dave")
    first = chat(alice, "expiring", prompt_cache_options={"ttl": "30m"}, prompt_cache_key="e")
    advance_pin_clock(stack, 29 * 60)
    flood(stack)
    kept = chat(alice, "expiring")
    assert cached(kept) == whole_blocks_before_last(first.usage.prompt_tokens)
    # The read renewed it: 30 minutes from then. Past them, it is gone and a flood evicts it.
    assert advance_pin_clock(stack, 30 * 60 + 1) >= 1
    flood(stack)
    assert cached(chat(alice, "expiring")) == 0


def test_a_stored_response_keeps_its_context_pinned_until_deleted(stack) -> None:
    alice = openai_client(stack, "grace")
    first = alice.responses.create(
        model="dummy", instructions=system("store"), input="remember", max_output_tokens=16
    )
    flood(stack)
    second = alice.responses.create(
        model="dummy",
        previous_response_id=first.id,
        instructions=system("store"),  # instructions do not carry over (OpenAI's rule)
        input="next",
        max_output_tokens=2,
    )
    # The first prompt is a prefix of the second (the template renders turn after turn).
    assert second.usage.input_tokens_details.cached_tokens >= (
        first.usage.input_tokens // BLOCK_SIZE * BLOCK_SIZE
    )
    pins_before = num_pins(stack)
    alice.responses.delete(first.id)
    alice.responses.delete(second.id)
    deadline = time.monotonic() + 5
    while num_pins(stack) > pins_before - 2 and time.monotonic() < deadline:
        time.sleep(0.02)  # the store releases its pins in a task of the frontend's loop
    assert num_pins(stack) == pins_before - 2


def num_pins(stack) -> int:
    return sum(n.num_pins for n in kv_stats(stack).pins.namespaces)


@pytest.mark.parametrize(
    ("pins", "field"),
    [
        ([pb.CachePin(ttl_s=0)], "cache_pins[0].ttl_s"),
        ([pb.CachePin(ttl_s=86401)], "cache_pins[0].ttl_s"),
        ([pb.CachePin(ttl_s=60)] * 5, "cache_pins"),
        ([pb.CachePin(ttl_s=60, num_prompt_tokens=999)], "cache_pins[0].num_prompt_tokens"),
        ([pb.CachePin(ttl_s=60, message_index=0)], "cache_pins[0].message_index"),
        ([pb.CachePin(ttl_s=60, key="k" * 257)], "cache_pins[0].key"),
    ],
)
def test_bad_pins_are_invalid_argument_naming_the_field(stack, pins, field) -> None:
    request = pb.GenerateRequest(prompt="a bad pin", max_new_tokens=1, cache_pins=pins)
    with pytest.raises(grpc.RpcError) as raised:
        text_stub(stack).Generate(request, metadata=grpc_metadata("alice"), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith(field)


def test_openai_prompt_cache_fields_out_of_the_api_are_a_400_naming_them(stack) -> None:
    alice = openai_client(stack, "alice")
    with pytest.raises(openai.BadRequestError) as raised:
        chat(alice, "bad", prompt_cache_options={"ttl": "5m"})
    assert raised.value.body["param"] == "prompt_cache_options.ttl"


@pytest.mark.parametrize("stream", [False, True])
def test_a_pin_refused_leaves_the_request_running_and_says_why_in_a_header(stack, stream) -> None:
    # A prompt shorter than a block: nothing whole to pin.
    raw = openai_client(stack, "bob").completions.with_raw_response.create(
        model="dummy",
        prompt="hi",
        max_tokens=1,
        stream=stream,
        extra_body={"prompt_cache_retention": "24h"},
    )
    assert raw.headers["zerolayer-pin-refusal"] == "pin-nothing-cached"
    completion = raw.parse()
    assert len(list(completion) if stream else completion.choices) >= 1


def test_a_tenant_removed_from_the_tenants_file_loses_its_pins(stack) -> None:
    """Last: alice leaves the --tenants file; the frontend, restarted (how the file is read
    again), ends her pins and no one else's."""
    alice = scoped_cache_salt("alice", "")
    before = {n.cache_salt for n in kv_stats(stack).pins.namespaces}
    assert alice in before
    tenants_file(Path(stack.config.tenants).parent, {t: t for t in TENANTS if t != "alice"})
    old_pid = stack.processes["frontend"].pid
    stack.processes["frontend"].kill()
    deadline = time.monotonic() + 60
    while stack.processes["frontend"].pid == old_pid and time.monotonic() < deadline:
        time.sleep(0.05)  # the supervisor restarts it
    stack.wait_healthy("frontend", deadline)
    while alice in {n.cache_salt for n in kv_stats(stack).pins.namespaces}:
        assert time.monotonic() < deadline, "alice's pins were not released"
        time.sleep(0.05)  # released in the background of the frontend's start
    assert {n.cache_salt for n in kv_stats(stack).pins.namespaces} == before - {alice}
