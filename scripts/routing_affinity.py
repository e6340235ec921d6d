"""Does prefix-affine routing still help when the KV cache is shared? (issue 13, docs/benchmarks.md)

Starts the two-scheduler stack of the e2e tests (tests/e2e/two_schedulers.py) once per routing
policy and sends the same workload: ``--conversations`` conversations, each with its own
``--prefix-tokens`` prefix, in ``--rounds`` rounds; in each round every conversation sends one
request (``--fanout`` requests) at once: its prefix, then a new suffix. Prints, per policy, the
share of prompt tokens found in the prefix cache, the mean latency of a request and the wall time.

    .venv/bin/python scripts/routing_affinity.py [--model DIR]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from e2e.stack import text_stub  # noqa: E402
from e2e.two_schedulers import start_two_schedulers  # noqa: E402

from zerolayer.checkpoints.dummy import ensure_dummy_model  # noqa: E402
from zerolayer.v1 import generation_pb2 as pb  # noqa: E402


def workload(args: argparse.Namespace) -> list[list[list[int]]]:
    """rounds x conversations prompts (token ids)."""
    rng = random.Random(0)
    prefixes = [
        [1, *(rng.randrange(3, 256) for _ in range(args.prefix_tokens))]
        for _ in range(args.conversations)
    ]
    return [
        [
            p + [rng.randrange(3, 256) for _ in range(args.suffix_tokens)]
            for p in prefixes
            for _ in range(args.fanout)
        ]
        for _ in range(args.rounds)
    ]


def run(policy: str, model_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zlr-", dir="/tmp") as run_dir:
        cluster = start_two_schedulers(model_dir, Path(run_dir), routing=policy)
        try:
            time.sleep(2.5)  # the frontend sees both schedulers SERVING
            stub = text_stub(cluster.stack)

            def one(ids: list[int]) -> tuple[float, pb.GenerateResponse]:
                start = time.monotonic()
                request = pb.GenerateRequest(
                    prompt_token_ids=pb.TokenIds(ids=ids),
                    max_new_tokens=args.max_new_tokens,
                    ignore_eos=True,
                )
                response = stub.Generate(request, timeout=300)
                return time.monotonic() - start, response

            results = []
            start = time.monotonic()
            with ThreadPoolExecutor(args.conversations * args.fanout) as pool:
                for prompts in workload(args):
                    results += list(pool.map(one, prompts))
            wall_s = time.monotonic() - start
        finally:
            cluster.stop()
    prompt = sum(r.usage.prompt_tokens for _, r in results)
    cached = sum(r.usage.cached_prompt_tokens for _, r in results)
    return {
        "cached_share": cached / prompt,
        "mean_latency_ms": 1000 * statistics.mean(t for t, _ in results),
        "wall_s": wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny dummy model")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--fanout", type=int, default=1, help="requests per conversation a round")
    parser.add_argument("--prefix-tokens", type=int, default=256)
    parser.add_argument("--suffix-tokens", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--policies", default="least-work,prefix-affine", help="in this order")
    args = parser.parse_args()
    model_dir = args.model or ensure_dummy_model(cache_dir=Path(tempfile.mkdtemp()))
    for repeat in range(args.repeats):
        for policy in args.policies.split(","):
            result = run(policy, model_dir, args)
            print(
                f"repeat {repeat} {policy:13s} cached {result['cached_share']:.1%} "
                f"mean latency {result['mean_latency_ms']:.0f} ms wall {result['wall_s']:.2f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
