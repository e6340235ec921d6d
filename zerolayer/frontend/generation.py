"""The frontend's domain object: text in, validated engine request out, text pieces back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import replace

from opentelemetry import trace

from zerolayer.checkpoints.dtypes import torch_name
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.common.config import FrontendConfig
from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import (
    FinishReason,
    GenerateParams,
    GenerationChunk,
    ModelInfo,
    RequestOutput,
    TokenizeParams,
    TokenizeResult,
    Usage,
)
from zerolayer.common.structured_output import grammar_of
from zerolayer.frontend.chat.output_parser import OutputParser, OutputPlan, parsed_chunk
from zerolayer.frontend.chat.reasoning import prompt_opens_thought
from zerolayer.frontend.chat.tool_request import plan_output
from zerolayer.frontend.kv_pin_client import KVPins
from zerolayer.frontend.metrics import FrontendMetrics
from zerolayer.frontend.prompt_cache import PinPlan, RequestPins, check_cache_pins, plan_pins
from zerolayer.frontend.routing.scheduler_pool import SchedulerPool
from zerolayer.frontend.telemetry import GenerationTelemetry
from zerolayer.frontend.tenants import scoped_cache_salt
from zerolayer.frontend.text.chat_template import ChatTemplate
from zerolayer.frontend.text.detokenizer import IncrementalDetokenizer
from zerolayer.frontend.text.logprob_tokens import GeneratedTokenTexts, with_token_texts
from zerolayer.frontend.text.stop_strings import StopStringMatcher
from zerolayer.frontend.text.tokenizer import TextTokenizer
from zerolayer.frontend.text.validation import (
    ServedModel,
    check_fits_context,
    check_model,
    check_text_length,
    validate,
)
from zerolayer.sharing.manifest import WeightManifest, model_dtype_name

PROMPT_TAIL_TOKENS = 32
"""The prompt's last tokens read for an open ``<think>`` (a generation prompt's end)."""


class TextGenerator:
    """Validates, tokenizes, forwards to the scheduler, detokenizes and applies stop strings."""

    def __init__(
        self,
        config: FrontendConfig,
        manifest: WeightManifest,
        scheduler: SchedulerPool,
        tracer: trace.Tracer | None = None,
        metrics: FrontendMetrics | None = None,
        kv_pins: KVPins | None = None,
    ) -> None:
        """
        Args:
            kv_pins: where the pins of ``GenerateParams.cache_pins`` are made (None: the
                frontend's ``--pin-kvstore``, "" refusing them all).
        """
        self.kv_pins = kv_pins or KVPins(config.pin_kvstore_address)
        self.tracer = tracer or trace.NoOpTracer()
        self.metrics = metrics
        self.config = config
        self.manifest = manifest
        self.model_config = ModelConfig.from_json(
            manifest.config_json, manifest.generation_config_json
        )
        self.tokenizer = TextTokenizer.from_json(
            manifest.tokenizer_json, manifest.tokenizer_config_json
        )
        self.chat_template = ChatTemplate.from_model_files(
            manifest.tokenizer_config_json, manifest.chat_template_jinja
        )
        self.served = ServedModel(
            manifest.model, self.model_config.vocab_size, self.model_config.max_model_len
        )
        self.scheduler = scheduler
        self._grammar_checks = ThreadPoolExecutor(1, thread_name_prefix="grammar-check")
        """Where structured-output constraints compile, one at a time (llguidance releases the
        GIL meanwhile)."""

    @property
    def ready(self) -> bool:
        """True while some scheduler can take requests (the public health and readiness)."""
        return self.scheduler.router.available

    def tokenize(self, params: TokenizeParams) -> TokenizeResult:
        """Tokenizes ``params.text`` with the model's tokenizer.

        Raises:
            NotFound: ``params.model`` names another model.
            InvalidArgument: the text is too long for the context (``text``).
        """
        check_model(params.model, self.served)
        check_text_length("text", params.text, self.served)
        token_ids = self.tokenizer.encode(params.text, add_special_tokens=params.add_special_tokens)
        return TokenizeResult(tuple(token_ids), tuple(self.tokenizer.pieces(token_ids)))

    async def model_info(self) -> ModelInfo:
        """The served model; its block size comes from the scheduler (0 if unreachable)."""
        cfg = self.model_config
        return ModelInfo(
            model=self.manifest.model,
            architecture=cfg.architecture,
            vocab_size=cfg.vocab_size,
            max_model_len=cfg.max_model_len,
            eos_token_ids=cfg.eos_token_ids,
            bos_token_id=cfg.bos_token_id,
            dtype=torch_name(model_dtype_name(self.manifest)),
            num_parameters=self.manifest.num_parameters,
            block_size=await self.scheduler.block_size(),
            fingerprint=self.manifest.fingerprint,
            has_chat_template=self.chat_template is not None,
        )

    async def count_prompt_tokens(self, params: GenerateParams) -> int:
        """How many prompt tokens a generation of ``params`` counts (its usage's
        ``prompt_tokens``): the prompt validated, rendered and tokenized as :meth:`generate`
        does it; nothing is generated.

        Raises:
            InvalidArgument, NotFound: from validation.
        """
        request = await asyncio.to_thread(
            validate, params, self.served, self.tokenizer, self.config, self.chat_template
        )
        return len(request.prompt_token_ids)

    async def generate(
        self,
        params: GenerateParams,
        timeout_s: float | None,
        stream: bool = False,
        tenant: str = "",
        fit_context: bool = False,
        usage_on_every_chunk: bool = False,
    ) -> AsyncIterator[GenerationChunk]:
        """Streams a generation: one chunk per engine step (and sample), the last with usage.

        With n > 1, each chunk carries its sample's ``index`` and a sample's last chunk its finish
        reason; usage counts the prompt once and the tokens of every sample.

        Text never ends inside a UTF-8 character, and never contains a stop string (text stops
        right before it; ``token_ids`` still include the tokens that completed it). Closing the
        iterator early aborts the request in the scheduler. A scheduler that dies mid-stream is
        invisible here: the stream continues on another (see ``SchedulerPool``).

        Args:
            stream: whether the caller sends each chunk in a response of its own (recorded
                in the trace as ``gen_ai.request.stream``); else the latency metrics count
                the one response sent after the last chunk (zerolayer.frontend.telemetry).
            tenant: the caller's tenant, said by the server (zerolayer.frontend.tenants); the
                prompt's cached prefixes are then that tenant's alone, ``cache_salt`` narrowing
                them; "": none, ``cache_salt`` as sent.
            fit_context: refuse a ``max_new_tokens`` past the context (OpenAI's semantics, see
                ``validation.check_fits_context``); off: generation stops at the context's end.
            usage_on_every_chunk: every chunk carries the usage so far (Anthropic's stream
                starts with the prompt's); off: only the stream's last chunk does.

        With ``params.parse_output`` (chat), each chunk's text is the answer only, its thought in
        ``reasoning_text`` and its tool calls in ``tool_call_deltas`` (zerolayer.frontend.chat);
        a sample that called tools and ended by EOS or a stop token (not a stop string) finishes
        with TOOL_CALLS.

        Raises:
            InvalidArgument, NotFound: from validation (a structured-output constraint's compile
                included: ``zerolayer.common.structured_output.grammar_of``) and
                zerolayer.frontend.chat.tool_request.
            Unavailable: no scheduler can take the request, or schedulers died under it in two
                separate incidents (see ``zerolayer.frontend.routing.failover``).
        """
        telemetry = GenerationTelemetry(self.tracer, self.metrics, self.served.name, stream)
        with telemetry.tokenize_span():
            source = self.chat_template.source if self.chat_template is not None else None
            params, plan = plan_output(params, source, self.config.tool_call_parser)
            check_cache_pins(params)
            # Tokenizing a long prompt takes a while: keep the event loop free for other calls.
            request = await asyncio.to_thread(
                validate, params, self.served, self.tokenizer, self.config, self.chat_template
            )
            if request.structured_output is not None:
                # NOTE: on a thread of its own: a large grammar's compile (up to seconds) then
                # delays only the constrained requests behind it, not other requests' tokenizing
                await asyncio.get_running_loop().run_in_executor(
                    self._grammar_checks, grammar_of, request.structured_output
                )
            if fit_context:
                check_fits_context(params, request, self.served)
            # NOTE: a thread only for pins that render the chat again; most requests have none
            pin_plan = (
                await asyncio.to_thread(
                    plan_pins, params, request.prompt_token_ids, self.chat_template, self.tokenizer
                )
                if params.cache_pins
                else PinPlan()
            )
        request = replace(request, cache_salt=scoped_cache_salt(tenant, request.cache_salt))
        pins = RequestPins(
            self.kv_pins,
            pin_plan,
            request.cache_salt,
            request.prompt_token_ids,
            # NOTE: a tenant's salts share its budget (none: a salt is its own namespace)
            scoped_cache_salt(tenant, "") if tenant else "",
            self.tracer,
        )
        telemetry.validated(request)
        # One detokenizer and stop-string matcher per sample (n > 1: outputs carry its index).
        # NOTE: a tool-call format's marker may be a special token (Mistral's [TOOL_CALLS],
        # Llama's <|python_tag|>): its text is kept for the parser.
        markers = plan.tool_format.markers if plan and plan.tool_format else ()
        keep = self.tokenizer.special_token_ids(markers)
        detokenizers = [
            IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, keep)
            for _ in range(request.n)
        ]
        stops = [StopStringMatcher(params.stop) for _ in range(request.n)]
        token_texts = [
            GeneratedTokenTexts(self.tokenizer, request.prompt_token_ids)
            for _ in range(request.n if params.logprobs is not None else 0)
        ]
        parsers = self._output_parsers(plan, request.prompt_token_ids, request.n)
        finished = [False] * request.n
        num_generated = 0
        num_cached = 0
        max_model_len = self.served.max_model_len
        async with aclosing(
            self.scheduler.generate(request, timeout_s, max_model_len, tenant)
        ) as outputs:
            async for output in outputs:
                index = output.index
                if finished[index]:
                    continue  # a sample this frontend stopped: its tokens until the abort
                num_generated += len(output.new_token_ids)
                num_made = len(pins.made)
                if index == 0:
                    num_cached = output.num_cached_tokens
                    if not pins.plan.empty:
                        await pins.on_output(output)
                usage = pins.usage(Usage(len(request.prompt_token_ids), num_generated, num_cached))
                started = time.perf_counter()
                chunk = self._chunk(
                    request.request_id, output, usage, detokenizers[index], stops[index]
                )
                if parsers:
                    chunk = parsed_chunk(chunk, parsers[index])
                if output.logprobs or output.prompt_logprobs:
                    final = chunk.finish_reason != FinishReason.UNSPECIFIED
                    logprobs = output.logprobs
                    chunk = replace(
                        chunk,
                        logprobs=token_texts[index].named(logprobs, final) if logprobs else (),
                        prompt_logprobs=with_token_texts(output.prompt_logprobs, self.tokenizer),
                    )
                telemetry.detokenized(time.perf_counter() - started)
                finished[index] = chunk.finish_reason != FinishReason.UNSPECIFIED
                if not all(finished) and not usage_on_every_chunk:
                    chunk = replace(chunk, usage=None)  # usage: on the stream's last chunk
                if pins.made and (chunk.usage is not None or len(pins.made) > num_made):
                    chunk = replace(chunk, pin_ids=pins.pin_ids, pin_refusal=pins.refusal)
                if index:
                    chunk = replace(chunk, index=index)
                telemetry.sent(chunk)
                yield chunk
                if all(finished):
                    return  # closing the stream cancels the call: a stopped request is aborted
                if finished[index] and not output.finished:
                    # A stop string ended this sample only: end it in the scheduler too.
                    await self.scheduler.abort_sample(request.request_id, index, tenant)
        raise Unavailable("scheduler: stream ended without a finished output")

    def _output_parsers(
        self, plan: OutputPlan | None, prompt_token_ids: tuple[int, ...], n: int
    ) -> list[OutputParser]:
        """One output parser per sample (none without a plan)."""
        if plan is None:
            return []
        # NOTE: a template may open the thought in the generation prompt (DeepSeek-R1's).
        tail = self.tokenizer.decode(
            list(prompt_token_ids[-PROMPT_TAIL_TOKENS:]), skip_special_tokens=False
        )
        in_thought = plan.thinks and prompt_opens_thought(tail)
        return [plan.parser(in_thought) for _ in range(n)]

    @staticmethod
    def _chunk(
        request_id: str,
        output: RequestOutput,
        usage: Usage,
        detokenizer: IncrementalDetokenizer,
        stops: StopStringMatcher,
    ) -> GenerationChunk:
        # NOTE: a stop token id's text is not output (as EOS's, a special token, is not).
        stopped = output.finish_reason == FinishReason.STOP
        text_ids = output.new_token_ids[:-1] if stopped else output.new_token_ids
        text, matched = stops.feed(detokenizer.step(text_ids))
        reason = FinishReason.STOP if matched else output.finish_reason
        if reason == FinishReason.UNSPECIFIED:
            return GenerationChunk(request_id, text, output.new_token_ids, usage=usage)
        if not matched:
            tail, matched = stops.feed(detokenizer.flush())
            text += tail if matched else tail + stops.flush()
            reason = FinishReason.STOP if matched else reason
        return GenerationChunk(
            request_id, text, output.new_token_ids, reason, usage, stop_string=stops.matched_stop
        )
