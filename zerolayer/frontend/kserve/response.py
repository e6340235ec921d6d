"""Generation results written as KServe v2 responses (``inference.GRPCInferenceService``): the
writing half of the KServe codec, :mod:`zerolayer.frontend.kserve.request` being the reading one.

The text goes out as ``text_output`` (BYTES, the request's ``text_input`` shape) in
``raw_output_contents``; the finish reason and token counts as response parameters, the way
Triton's vLLM backend reports them. Spec: https://github.com/kserve/open-inference-protocol.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    FinishReason,
    GenerationChunk,
    PositionLogprobs,
    TokenLogprob,
)
from zerolayer.frontend.kserve.request import ALIASES, METADATA_DTYPE, SETTINGS, TextRequest
from zerolayer.frontend.kserve.tensors import pack_bytes
from zerolayer.frontend.text.validation import MAX_REQUEST_ID_CHARS, check_request_id
from zerolayer.kserve.v2 import grpc_service_pb2 as pb

MODEL_VERSION = "1"
"""The only version served (requests may also leave the version empty)."""
FINAL_RESPONSE_PARAM = "triton_final_response"
"""Response parameter Triton sets on a decoupled model's last response to a request."""


def server_live_response() -> pb.ServerLiveResponse:
    """ServerLive: a process that answers is live."""
    return pb.ServerLiveResponse(live=True)


def server_ready_response(ready: bool) -> pb.ServerReadyResponse:
    """ServerReady: whether some scheduler can take requests."""
    return pb.ServerReadyResponse(ready=ready)


def model_ready_response(ready: bool) -> pb.ModelReadyResponse:
    """ModelReady: whether the named model and version are served and some scheduler can take
    requests."""
    return pb.ModelReadyResponse(ready=ready)


def server_metadata_response(version: str) -> pb.ServerMetadataResponse:
    """ServerMetadata: zerolayer at ``version``, no protocol extensions."""
    return pb.ServerMetadataResponse(name="zerolayer", version=version, extensions=[])


def model_metadata_response(model: str) -> pb.ModelMetadataResponse:
    """ModelMetadata: ``text_input``, ``sampling_parameters`` and every scalar setting (and
    its aliases) in; ``text_output`` out."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    inputs = [tensor(name="text_input", datatype="BYTES", shape=[-1])]
    inputs.append(tensor(name="sampling_parameters", datatype="BYTES", shape=[1]))
    for name, kind in [*SETTINGS.items(), *((a, SETTINGS[k]) for a, k in ALIASES.items())]:
        shape = [-1] if kind in ("strings", "uints") else [1]
        dtype = "UINT64" if name.endswith("seed") else METADATA_DTYPE[kind]
        inputs.append(tensor(name=name, datatype=dtype, shape=shape))
    outputs = [tensor(name=name, datatype="BYTES", shape=[-1]) for name in OUTPUTS]
    return pb.ModelMetadataResponse(
        name=model, versions=[MODEL_VERSION], platform="zerolayer", inputs=inputs, outputs=outputs
    )


OUTPUTS = ("text_output", "logprobs", "prompt_logprobs")
"""Output tensors: the text always; each logprobs output when its setting is given."""


def _token_json(t: TokenLogprob) -> dict[str, object]:
    return {"token_id": t.token_id, "token": t.token, "logprob": t.logprob}


def logprobs_json(positions: Sequence[PositionLogprobs]) -> bytes:
    """The ``logprobs`` / ``prompt_logprobs`` output element: a JSON array with one object per
    position, ``{"token_id", "token", "logprob", "rank", "top_logprobs": [{"token_id",
    "token", "logprob"}...]}`` (natural logs of the raw logits' softmax; see GenerateResponse)."""
    return json.dumps(
        [
            {
                **_token_json(p.chosen),
                "rank": p.rank,
                "top_logprobs": [_token_json(t) for t in p.top],
            }
            for p in positions
        ]
    ).encode()


def infer_response(
    model: str,
    request: pb.ModelInferRequest,
    text_request: TextRequest,
    text: str,
    chunk: GenerationChunk,
    final: bool | None,
) -> pb.ModelInferResponse:
    """One response carrying ``text``; ``chunk`` (the last or only one it covers) gives the
    finish reason and usage once the generation has ended.

    Args:
        model: the served model's name.
        request: the request answered (its ``id`` is echoed).
        text_request: the request as read (its output shape).
        text: the text to send (a piece, or the whole text, as the caller decides).
        chunk: the generation chunk the response ends with; its logprobs (the positions this
            response covers) go out as the ``logprobs`` and ``prompt_logprobs`` outputs when the
            request asked for them.
        final: ``triton_final_response`` (streams); None leaves it out (ModelInfer).
    """
    output = pb.ModelInferResponse.InferOutputTensor(
        name="text_output", datatype="BYTES", shape=text_request.output_shape
    )
    response = pb.ModelInferResponse(
        model_name=model,
        model_version=MODEL_VERSION,
        id=request.id,
        outputs=[output],
        raw_output_contents=[pack_bytes([text.encode()])],
    )
    params = text_request.params
    for name, asked, positions in (
        ("logprobs", params.logprobs, chunk.logprobs),
        ("prompt_logprobs", params.prompt_logprobs, chunk.prompt_logprobs),
    ):
        if asked is not None:
            response.outputs.append(
                pb.ModelInferResponse.InferOutputTensor(name=name, datatype="BYTES", shape=[1])
            )
            response.raw_output_contents.append(pack_bytes([logprobs_json(positions)]))
    if final is not None:
        response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
    if chunk.finish_reason != FinishReason.UNSPECIFIED:
        response.parameters["finish_reason"].string_param = chunk.finish_reason.name.lower()
        if chunk.usage is not None:
            response.parameters["num_input_tokens"].int64_param = chunk.usage.prompt_tokens
            response.parameters["num_output_tokens"].int64_param = chunk.usage.completion_tokens
    return response


def stream_response(
    model: str,
    request: pb.ModelInferRequest,
    text_request: TextRequest,
    text: str,
    chunk: GenerationChunk,
) -> pb.ModelStreamInferResponse:
    """One ModelStreamInfer answer (see :func:`infer_response`), final when ``chunk`` ends the
    generation."""
    final = chunk.finish_reason != FinishReason.UNSPECIFIED
    response = infer_response(model, request, text_request, text, chunk, final=final)
    return pb.ModelStreamInferResponse(infer_response=response)


def stream_error_response(
    request: pb.ModelInferRequest, message: str
) -> pb.ModelStreamInferResponse:
    """A ModelStreamInfer answer that fails one request (``error_message``) and names it by its
    ``id``, when that is one a request may have (an id refused for its length or characters, and
    a model name or version of over 256 characters, are not echoed)."""
    try:
        check_request_id("id", request.id)
        request_id = request.id
    except InvalidArgument:
        request_id = ""
    bounded = [
        v if len(v) <= MAX_REQUEST_ID_CHARS else ""
        for v in (request.model_name, request.model_version)
    ]
    infer = pb.ModelInferResponse(model_name=bounded[0], model_version=bounded[1], id=request_id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=infer)
