"""Talks to zerolayer's KServe v2 / Triton gRPC endpoint with NVIDIA's own client, unchanged.

Needs only ``tritonclient[grpc]`` (not zerolayer), e.g. in a separate virtual environment:

    python3 -m venv .venv-triton && .venv-triton/bin/pip install 'tritonclient[grpc]==2.73.0'
    .venv-triton/bin/python examples/kserve/triton_client.py --url 127.0.0.1:50051 \
        --model MODEL --prompt "Hello" --max-tokens 16

Prints one JSON object: liveness, readiness, server metadata, the text of one ``infer`` call,
and the pieces of one streamed ``async_stream_infer`` call.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
from collections.abc import Sequence

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def text_inputs(prompt: str, max_tokens: int, stream: bool) -> list[grpcclient.InferInput]:
    """The inputs Triton's LLM backends take: the prompt, ``stream``, and sampling settings."""
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    streaming = grpcclient.InferInput("stream", [1], "BOOL")
    streaming.set_data_from_numpy(np.array([stream], dtype=bool))
    limit = grpcclient.InferInput("max_tokens", [1], "INT32")
    limit.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    # vLLM backend style: the rest of the sampling settings as one JSON string.
    sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    settings = json.dumps({"temperature": 0, "ignore_eos": True})
    sampling.set_data_from_numpy(np.array([settings.encode()], dtype=np.object_))
    return [text, streaming, limit, sampling]


def infer_text(client: grpcclient.InferenceServerClient, args: argparse.Namespace) -> dict:
    """One ModelInfer call: the whole text at once."""
    result = client.infer(
        args.model,
        text_inputs(args.prompt, args.max_tokens, stream=False),
        request_id="infer-1",
        outputs=[grpcclient.InferRequestedOutput("text_output")],
    )
    response = result.get_response()
    return {
        "id": response.id,
        "model_name": response.model_name,
        "model_version": response.model_version,
        "text": result.as_numpy("text_output")[0].decode(),
    }


def stream_text(client: grpcclient.InferenceServerClient, args: argparse.Namespace) -> dict:
    """One ModelStreamInfer request with ``stream`` true: pieces until the final response."""
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(
            args.model,
            text_inputs(args.prompt, args.max_tokens, stream=True),
            request_id="stream-1",
        )
        pieces, final = [], False
        while not final:
            result, error = responses.get(timeout=args.timeout_s)
            if error is not None:
                return {"error": str(error), "pieces": pieces}
            pieces.append(result.as_numpy("text_output")[0].decode())
            final = result.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()
    return {"id": result.get_response().id, "pieces": pieces, "text": "".join(pieces)}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs every call against ``--url`` and prints the JSON summary; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:50051", help="the frontend's HOST:PORT")
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument("--prompt", default="Hello, zerolayer")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=30.0, help="wait per stream response")
    args = parser.parse_args(argv)
    client = grpcclient.InferenceServerClient(url=args.url)
    try:
        metadata = client.get_server_metadata()
        summary = {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "model_ready": client.is_model_ready(args.model),
            "server": {"name": metadata.name, "version": metadata.version},
            "infer": infer_text(client, args),
            "stream": stream_text(client, args),
        }
    except InferenceServerException as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    finally:
        client.close()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
