"""Without supervision (``zerolayer up --no-supervise``): a killed kvstore is logged and not
restarted, and requests that need it end with UNAVAILABLE after the scheduler's
``--kv-unavailable-timeout-s`` instead of hanging; the scheduler keeps answering."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import grpc
import pytest
from e2e.stack import running_stack, scheduler_stats, text_stub

from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

TIMEOUT_S = 2.0


def test_requests_end_with_unavailable_once_the_unsupervised_kvstore_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="zerolayer.stack.launcher")
    model_dir = ensure_dummy_model(cache_dir=tmp_path / "cache")
    with running_stack(
        model_dir, tmp_path / "logs", supervise=False, kv_unavailable_timeout_s=TIMEOUT_S
    ) as stack:
        stub = text_stub(stack)
        request = pb.GenerateRequest(prompt="hello", max_new_tokens=4)
        assert len(stub.Generate(request, timeout=30).token_ids) == 4
        kvstore = stack.processes["kvstore"]
        os.kill(kvstore.pid, signal.SIGKILL)
        kvstore.wait(timeout=10)

        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as first:
            stub.Generate(request, timeout=60)
        first_s = time.monotonic() - start
        assert first.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "kvstore: unusable for more than 2 s" in first.value.details()
        assert TIMEOUT_S <= first_s < TIMEOUT_S + 15

        # The outage is older than the timeout now: the next request fails at its first step.
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as second:
            stub.Generate(request, timeout=60)
        assert second.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - start < TIMEOUT_S
        stats = scheduler_stats(stack)
        assert (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0)
        assert stack.num_restarts["kvstore"] == 0
        assert kvstore.poll() is not None

    exits = [r.getMessage() for r in caplog.records if "not restarted" in r.getMessage()]
    assert exits == [
        "zerolayer: kvstore exited with code -9; not restarted (--no-supervise): "
        "requests that need it fail with UNAVAILABLE"
    ]
