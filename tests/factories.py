"""Test factories, defined once and imported by the tests (``pythonpath = tests``), as vLLM's
tests/v1/core/utils.py is: requests at each edge (the public ``GenerateRequest``, KServe's
``ModelInferRequest``, the scheduler's ``EngineRequest`` and its ``Request``), engines over an
in-process block pool, greedy references (the engine's and transformers'), and a stand-in
generator under the HTTP APIs. Defaults are the common case; a test passes what it depends
on."""

from __future__ import annotations

import asyncio
import signal
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from prometheus_client import CollectorRegistry

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.checkpoints.gguf.tensor_types import SERVED_TYPES
from zerolayer.common.generation import (
    EngineRequest,
    GenerateParams,
    GenerationChunk,
    RequestOutput,
    SamplingParams,
)
from zerolayer.frontend.http_server import HttpServer, HttpServerConfig
from zerolayer.frontend.text.validation import ServedModel
from zerolayer.kserve.v2 import grpc_service_pb2 as kserve_pb
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.kv_cache_manager import BlockAllocator, KVCacheManager
from zerolayer.scheduler.core.request import Request
from zerolayer.scheduler.core.scheduler import Scheduler, SchedulingPolicy
from zerolayer.scheduler.engine_factory import EngineConfig
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.v1 import generation_pb2 as pb

MAX_NEW_TOKENS = 24
"""New tokens per prompt of :func:`generate` and :func:`hf_generate`."""
T = TypeVar("T")


def make_generate_request(*, ids: list[int] | None = None, **fields: object) -> pb.GenerateRequest:
    """A public ``GenerateRequest``: 8 new tokens unless ``max_new_tokens`` says otherwise;
    ``ids`` are the prompt's token ids (``prompt_token_ids``); ``fields`` are its fields."""
    if ids is not None:
        fields["prompt_token_ids"] = pb.TokenIds(ids=ids)
    fields.setdefault("max_new_tokens", 8)
    return pb.GenerateRequest(**fields)


def pack_bytes(*items: bytes) -> bytes:
    """Raw BYTES tensor contents: each element as a little-endian uint32 length, then the bytes."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def make_infer_request(
    model: str, prompt: str | None, **inputs: object
) -> kserve_pb.ModelInferRequest:
    """A KServe ``ModelInferRequest`` laid out the way tritonclient sends one: every input in
    raw_input_contents; ``prompt`` is ``text_input`` (None: none).

    ``inputs`` values: bool -> BOOL, int -> INT32, float -> FP32, str -> BYTES, list -> BYTES.
    """
    request = kserve_pb.ModelInferRequest(model_name=model, id="req-1")
    if prompt is not None:
        inputs = {"text_input": prompt, **inputs}
    for name, value in inputs.items():
        if isinstance(value, bool):
            datatype, raw, count = "BOOL", bytes([value]), 1
        elif isinstance(value, int):
            datatype, raw, count = "INT32", struct.pack("<i", value), 1
        elif isinstance(value, float):
            datatype, raw, count = "FP32", struct.pack("<f", value), 1
        else:
            items = [value] if isinstance(value, str) else list(value)
            datatype, raw, count = "BYTES", pack_bytes(*(s.encode() for s in items)), len(items)
        tensor = kserve_pb.ModelInferRequest.InferInputTensor
        request.inputs.append(tensor(name=name, datatype=datatype, shape=[count]))
        request.raw_input_contents.append(raw)
    return request


def make_tensor_request(
    *inputs: tuple[str, str, list[int]], raw: list[bytes] | None = None
) -> kserve_pb.ModelInferRequest:
    """A KServe ``ModelInferRequest`` of model "m" declaring ``inputs`` (name, datatype, shape),
    with ``raw`` as its raw_input_contents as they are (to test the tensor codec)."""
    request = kserve_pb.ModelInferRequest(model_name="m")
    for name, datatype, shape in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raw or [])
    return request


def text_output(response: kserve_pb.ModelInferResponse) -> str:
    """The text of a response whose one output is ``text_output`` (BYTES, one element)."""
    assert [(o.name, o.datatype) for o in response.outputs] == [("text_output", "BYTES")]
    (raw,) = response.raw_output_contents
    (size,) = struct.unpack_from("<I", raw)
    assert len(raw) == 4 + size
    return raw[4:].decode()


def make_engine_request(
    request_id: str = "r1",
    prompt_token_ids: Iterable[int] = (1, 2, 3),
    max_new_tokens: int = 8,
    sampling: SamplingParams | None = None,
    **fields: object,
) -> EngineRequest:
    """An ``EngineRequest`` as the scheduler receives it (greedy unless ``sampling``);
    ``fields`` are its other fields (``ignore_eos``, ``cache_salt``, ``n``, ...)."""
    return EngineRequest(
        request_id,
        tuple(prompt_token_ids),
        max_new_tokens,
        sampling if sampling is not None else SamplingParams(),
        **fields,  # type: ignore[arg-type]
    )


def make_request(
    request_id: str,
    prompt_token_ids: Iterable[int],
    block_ids: Iterable[int] = (),
    output_token_ids: Iterable[int] = (),
    **fields: object,
) -> Request:
    """The scheduler's ``Request`` (arrival index 0) of :func:`make_engine_request`'s request,
    holding ``block_ids`` and having generated ``output_token_ids`` so far; ``fields`` are the
    engine request's (``max_new_tokens``, ``sampling``, ...)."""
    request = Request(make_engine_request(request_id, prompt_token_ids, **fields), arrival_index=0)
    request.block_ids = list(block_ids)
    request.output_token_ids = list(output_token_ids)
    return request


def make_prompt(num_tokens: int, seed: int, vocab_size: int = 259) -> list[int]:
    """``num_tokens`` token ids drawn uniformly from 3 to ``vocab_size`` - 1 (no BOS, EOS or
    padding id), reproducibly from ``seed``; 259 is the dummy models' vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (num_tokens,), generator=g).tolist()


def make_engine(
    model: LocalModel,
    num_blocks: int,
    block_size: int = 16,
    *,
    enable_prefix_caching: bool = True,
    registry: CollectorRegistry | None = None,
    **config: object,
) -> tuple[Engine, LocalBlockAllocator]:
    """The engine as the scheduler process assembles it, over an in-process pool and a local
    arena of ``num_blocks`` blocks of ``block_size`` tokens; not started. ``config`` are
    ``EngineConfig`` fields (here pure-torch attention unless ``attention_backend`` says
    otherwise); its metrics go to ``registry`` (None: none)."""
    config.setdefault("attention_backend", "reference")
    layout = model.arena_layout_of_blocks(block_size, num_blocks)
    return build_local_engine(
        model,
        EngineConfig(**config),  # type: ignore[arg-type]
        layout,
        enable_prefix_caching=enable_prefix_caching,
        registry=registry,
    )


def make_scheduler(
    num_blocks: int,
    block_size: int,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    enable_prefix_caching: bool = True,
    allocator: BlockAllocator | None = None,
    clock: Callable[[], float] = time.monotonic,
    **policy: object,
) -> tuple[Scheduler, BlockAllocator]:
    """A scheduler over a fresh in-process pool of ``num_blocks`` blocks (free queue 0, 1, 2,
    ...) or over ``allocator``; EOS is token 2. ``policy`` are further ``SchedulingPolicy``
    fields. Returns the scheduler and its pool."""
    if allocator is None:
        allocator = LocalBlockAllocator(num_blocks, block_size, enable_prefix_caching)
    limits = SchedulingPolicy(max_num_seqs, max_num_batched_tokens, max_model_len, **policy)
    kv = KVCacheManager(allocator, block_size, clock=clock)
    return Scheduler(limits, kv, eos_token_ids=(2,)), allocator


def make_engine_without_model(
    num_blocks: int, block_size: int, runner: object = None, **scheduler: object
) -> tuple[Engine, LocalBlockAllocator]:
    """An engine whose ``runner`` stands in for a model (None: it is never stepped), over
    :func:`make_scheduler`'s scheduler (``scheduler`` are its arguments)."""
    core, allocator = make_scheduler(num_blocks, block_size, **scheduler)  # type: ignore[arg-type]
    return Engine(core, runner, Sampler()), allocator  # type: ignore[arg-type]


def run_engine(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int = MAX_NEW_TOKENS,
    *,
    tag: str = "",
) -> dict[str, list[RequestOutput]]:
    """Submits every prompt (greedy, ignore_eos, ``max_new_tokens`` each; request id ``tag`` +
    its index) and steps ``engine`` here until all finish; each request's outputs."""
    outputs: dict[str, list[RequestOutput]] = {f"{tag}{i}": [] for i in range(len(prompts))}
    errors: list[Exception] = []

    def sink_for(request_id: str):
        def sink(result: RequestOutput | Exception) -> None:
            if isinstance(result, Exception):
                errors.append(result)
            else:
                outputs[request_id].append(result)

        return sink

    for i, prompt in enumerate(prompts):
        request = make_engine_request(f"{tag}{i}", prompt, max_new_tokens, ignore_eos=True)
        engine.submit(request, sink_for(request.request_id))
    engine.process_commands()
    for _ in range(1000):
        if not engine.has_unfinished_requests:
            break
        engine.step()
    assert errors == []
    assert not engine.has_unfinished_requests
    return outputs


def generate(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int = MAX_NEW_TOKENS,
    *,
    tag: str = "",
) -> list[list[int]]:
    """:func:`run_engine`'s new token ids of each prompt."""
    outputs = run_engine(engine, prompts, max_new_tokens, tag=tag)
    return [[t for o in outputs[f"{tag}{i}"] for t in o.new_token_ids] for i in range(len(prompts))]


def hf_generate(
    model_dir: Path,
    prompts: list[list[int]],
    device: str = "cpu",
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> list[list[int]]:
    """transformers' greedy ids for each prompt (float32, EOS ignored): the outside reference."""
    import transformers  # about two seconds: only where a test compares with it

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hf.to(device).eval()
    # NOTE: no EOS on the reference side: with min_new_tokens transformers would suppress EOS,
    # while the engine's ignore_eos keeps the argmax even when it is EOS.
    hf.generation_config.eos_token_id = None
    references = []
    with torch.inference_mode():
        for prompt in prompts:
            input_ids = torch.tensor([prompt], device=device)
            out = hf.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
            )
            references.append(out[0, len(prompt) :].tolist())
    return references


class StandInGenerator:
    """What the HTTP APIs use of a TextGenerator: readiness, the served model (``tiny``),
    ``generate()`` (yields ``chunks``; an exception among them is raised there) and
    ``count_prompt_tokens()`` (``num_prompt_tokens``); the params of every call are kept."""

    def __init__(
        self,
        chunks: list[GenerationChunk | Exception],
        ready: bool = True,
        num_prompt_tokens: int = 0,
    ) -> None:
        self.ready = ready
        self.served = ServedModel("tiny", 259, 64)
        self.metrics = None
        self.chunks = chunks
        self.num_prompt_tokens = num_prompt_tokens
        self.params: list[GenerateParams] = []

    async def generate(
        self, params: GenerateParams, *args: object, **kwargs: object
    ) -> AsyncIterator:
        self.params.append(params)
        for chunk in self.chunks:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk

    async def count_prompt_tokens(self, params: GenerateParams) -> int:
        self.params.append(params)
        return self.num_prompt_tokens


def serve_app(app: object, use: Callable[[int], T]) -> T:
    """Serves the ASGI ``app`` with the frontend's HTTP server on a free port and returns
    ``use(port)`` (run in a thread, so it may block)."""

    async def scenario() -> T:
        server = HttpServer(HttpServerConfig("127.0.0.1:0"))
        await server.start(app)
        try:
            return await asyncio.to_thread(use, server.port)
        finally:
            await server.stop()

    return asyncio.run(scenario())


def responses_event_schema(event_type: str) -> str:
    """The name of the schema of a Responses stream event's ``type`` in OpenAI's OpenAPI
    document (``response.output_item.added`` -> ``ResponseOutputItemAddedEvent``)."""
    names = {
        "response.output_text.delta": "ResponseTextDeltaEvent",
        "response.output_text.done": "ResponseTextDoneEvent",
        "error": "ResponseErrorEvent",
    }
    if event_type in names:
        return names[event_type]
    words = event_type.removeprefix("response.").replace(".", "_").split("_")
    return "Response" + "".join(word.capitalize() for word in words) + "Event"


FAMILY_TEMPLATES = Path(__file__).parent / "frontend" / "chat" / "templates"
"""The published chat templates of the tool-calling families (llama3.1.jinja, qwen3.jinja,
mistral-nemo.jinja: each the ``chat_template`` of its model's tokenizer_config.json)."""


def family_chat_model(dummy_model_dir: Path, out_dir: Path, template: str) -> Path:
    """A copy of the tiny dummy model whose tokenizer_config.json carries the published chat
    template ``template`` (a file name in :data:`FAMILY_TEMPLATES`); its tokenizer stays the
    byte-level one, so every character of a rendered prompt is a token."""
    import json
    import shutil

    shutil.copytree(dummy_model_dir, out_dir)
    config = json.loads((out_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = (FAMILY_TEMPLATES / template).read_text()
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def sentencepiece_like_tokenizer_json(words: list[str]) -> str:
    """A Llama-like tokenizer.json without a post-processor: <unk> <s> </s> (ids 0-2), the 256
    byte-fallback tokens <0xNN> (3 + NN), then ``words`` from id 259; Metaspace pre-tokenizer,
    and a decoder that strips one leading space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{byte:02X}>": 3 + byte for byte in range(256)})
    vocab.update({word: 259 + i for i, word in enumerate(words)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tokenizer.to_str()


def in_process(capfd: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``zerolayer ARGS`` run by the console script's ``main`` in this process: its exit code
    and what it wrote to stderr (file descriptor 2: the layers' too, had any started). The
    SIGINT/SIGTERM handlers ``up`` installs are put back afterwards."""
    from zerolayer.cli.main import main

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(list(args))
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return code, capfd.readouterr().err


GGUF_SCALE_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
"""Byte offsets of each quantized block's float16 scales (ggml-common.h)."""


def make_gguf_weight(
    type_name: str, n: int, k: int, seed: int = 0, scale: float = 0.01
) -> QuantWeight:
    """A weight [n, k] of random blocks of a GGUF type: random bytes with finite float16 scales
    (normal * ``scale``); Q8_0's values in [-127, 127], as every quantizer writes them; the float
    types normal * ``scale``."""
    qtype = SERVED_TYPES[type_name]
    gen = torch.Generator().manual_seed(seed)
    if not qtype.quantized:
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
        values = (torch.randn(n, k, generator=gen) * scale).to(dtype)
        return QuantWeight.of(values, type_name)
    blocks = torch.randint(0, 256, (n * k // qtype.block_size, qtype.type_size), generator=gen)
    blocks = blocks.to(torch.uint8)
    if type_name == "Q8_0":
        values = torch.randint(-127, 128, (blocks.shape[0], 32), generator=gen).to(torch.int8)
        blocks[:, 2:] = values.view(torch.uint8)
    for offset in GGUF_SCALE_OFFSETS[type_name]:
        halves = (torch.randn(blocks.shape[0], 1, generator=gen) * scale).to(torch.float16)
        blocks[:, offset : offset + 2] = halves.view(torch.uint8)
    return QuantWeight.of(blocks.reshape(n, -1), type_name)
