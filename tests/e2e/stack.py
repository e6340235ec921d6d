"""Helpers for end-to-end tests: run the real four-process stack on a free port."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

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
def running_stack(model_dir: Path, log_dir: Path, **overrides: object) -> Iterator[Stack]:
    """Starts the four layers with the same launcher the CLI uses; stops them afterwards.

    ``overrides`` are StackConfig fields, ``kv_cache_bytes`` (16 MiB here) among them."""
    settings: dict[str, object] = {
        "listen": f"127.0.0.1:{free_port()}",
        "kv_cache_bytes": 16 * 1024 * 1024,
        **overrides,
    }
    config = StackConfig(model_dir=str(model_dir), log_dir=str(log_dir), **settings)
    with Stack(config) as stack:
        yield stack


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
