"""Helpers for end-to-end tests: run the real four-process stack on a free port, and the one
stack a test session shares (:func:`shared_stack`, the ``shared_stack`` fixture)."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from e2e.trace_receiver import Receiver, running_receiver, tracing_env

from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.stack.launcher import Stack, StackConfig
from zerolayer.v1 import (
    generation_pb2,
    generation_pb2_grpc,
    kvstore_pb2,
    kvstore_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tenants_file(folder: Path, tokens: Mapping[str, str]) -> Path:
    """A ``--tenants`` file in ``folder`` listing each token of ``tokens`` (token -> tenant) by
    its SHA-256 digest."""
    digests: dict[str, list[str]] = {}
    for token, tenant in tokens.items():
        digests.setdefault(tenant, []).append(hashlib.sha256(token.encode()).hexdigest())
    path = folder / "tenants.json"
    path.write_text(json.dumps(digests))
    return path


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""The chat template :func:`chat_dummy_model` gives the tiny dummy model (which has none)."""


def chat_dummy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny dummy model with :data:`CHAT_TEMPLATE` as its chat_template.jinja."""
    model_dir = tmp_path_factory.mktemp("model") / "dummy"
    shutil.copytree(ensure_dummy_model(cache_dir=tmp_path_factory.mktemp("cache")), model_dir)
    (model_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return model_dir


@contextmanager
def running_stack(
    model_dir: Path, log_dir: Path, env: Mapping[str, str] | None = None, **overrides: object
) -> Iterator[Stack]:
    """Starts the four layers with the same launcher the CLI uses; stops them afterwards.

    ``env``: variables the layers start with (this process's environment is left as it was);
    ``overrides`` are StackConfig fields, ``kv_cache_bytes`` (16 MiB here) among them."""
    settings: dict[str, object] = {
        "listen": f"127.0.0.1:{free_port()}",
        "kv_cache_bytes": 16 * 1024 * 1024,
        **overrides,
    }
    stack = Stack(StackConfig(model_dir=str(model_dir), log_dir=str(log_dir), **settings))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        stack.start()
    try:
        yield stack
    finally:
        stack.stop()


SHARED_MAX_NUM_BATCHED_TOKENS = 48
"""The shared stack's step budget: prompts longer than 48 tokens prefill in chunks."""


@dataclass(frozen=True)
class SharedStack:
    """The one stack a test session shares (started by the first test that asks for it).

    It serves :func:`chat_dummy_model` (the tiny dummy model with a chat template) under its
    directory's name, with ``--http-listen``, Prometheus ports (``--metrics-port-base``), a
    48-token step budget (longer prompts prefill in chunks), no pins (``--max-pinned-fraction 0``:
    every pin is refused), no tenants and no TLS; every layer
    exports its spans to :attr:`receiver`.

    A test that uses it only reads: it never stops, kills, restarts or reconfigures a layer
    (such a test starts a stack of its own), ends with nothing in flight (it cancels what it
    starts and waits for its blocks to be free), sends prompts or cache salts of its own where
    the prefix cache matters, and reads counters and logs as deltas from its own start, since
    other tests moved them before.
    """

    stack: Stack
    model_dir: Path
    """The served checkpoint (a copy of the tiny dummy model with a chat template)."""
    receiver: Receiver
    """The OTLP receiver the layers export their spans to."""


@contextmanager
def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedStack]:
    """Starts the :class:`SharedStack` (and its trace receiver); stops both afterwards."""
    model_dir = chat_dummy_model(tmp_path_factory)
    with running_receiver() as (receiver, port):
        with running_stack(
            model_dir,
            tmp_path_factory.mktemp("shared-logs"),
            env=tracing_env(port),
            http_listen=f"127.0.0.1:{free_port()}",
            metrics_port_base=free_port(),
            max_num_batched_tokens=SHARED_MAX_NUM_BATCHED_TOKENS,
            # NOTE: no pins: a pin outlives its request (a stored response's lives for the
            # store's max age), and tests that only read must leave every block free
            max_pinned_fraction=0.0,
        ) as stack:
            yield SharedStack(stack, model_dir, receiver)


def text_stub(stack: Stack) -> generation_pb2_grpc.TextGenerationStub:
    """A stub of the public API on the stack's frontend (the channel lives with the stub)."""
    return generation_pb2_grpc.TextGenerationStub(grpc.insecure_channel(stack.config.listen))


def generate_ids(
    stub: generation_pb2_grpc.TextGenerationStub, ids: list[int], max_new_tokens: int, salt: str
) -> generation_pb2.GenerateResponse:
    """One greedy, ignore_eos Generate of the token ids ``ids`` under cache salt ``salt``."""
    return stub.Generate(
        generation_pb2.GenerateRequest(
            prompt_token_ids=generation_pb2.TokenIds(ids=ids),
            max_new_tokens=max_new_tokens,
            ignore_eos=True,
            cache_salt=salt,
        ),
        timeout=60,
    )


def kv_stats(stack: Stack) -> kvstore_pb2.KVStats:
    """The kvstore's block counts."""
    with grpc.insecure_channel(stack.address("kvstore")) as channel:
        return kvstore_pb2_grpc.KVStoreStub(channel).GetStats(
            kvstore_pb2.GetStatsRequest(), timeout=5
        )


def scheduler_stats(stack: Stack) -> scheduler_pb2.SchedulerStats:
    """The scheduler's counters."""
    with grpc.insecure_channel(stack.address("scheduler")) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return stub.GetStats(scheduler_pb2.SchedulerStatsRequest(), timeout=5)
