"""No constraint can hold up the others (issue 30, item 8), on the shared stack: a large grammar
compiles off the engine's step loop while another stream runs, and the constraints the limits
refuse are INVALID_ARGUMENT (HTTP 400 naming ``response_format``) with a short message and short
log lines, never INTERNAL with a traceback or the grammar's text."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import openai
import pytest
from e2e.stack import running_stack, text_stub

from zerolayer.common.generation import StructuredOutput
from zerolayer.scheduler.model.structured_output import GrammarBackend
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

NUM_ALTERNATIVES = 90_000
"""Words of the large grammar: about 1 MB, which takes about a second to compile (llguidance's
lexer fuel stops a grammar of these words at about 120,000) (a grammar within the
default --max-grammar-bytes of 128 KiB compiles in a fraction of a second: too close to the
scheduling noise of a loaded machine to tell a stall from it), served by a stack of its own with
:data:`WIDE_MAX_GRAMMAR_BYTES`."""
WIDE_MAX_GRAMMAR_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_CHARS = 400
"""Longest error detail a refused constraint may get (the field, then a bounded message)."""
PROMPT_IDS = [5, 6, 7, 8, 9, 10, 11, 12]


def alternatives(count: int, rule: str = "start") -> str:
    """A Lark grammar whose output is one of ``count`` words ``w0x``, ``w1x``, ...: alternatives
    of the rule ``start`` (llguidance's parser serves at most 2,000 at once), or of a terminal
    (``rule="WORD"``: its lexer serves any number)."""
    words = " | ".join(f'"w{i}x"' for i in range(count))
    return f"start: {words}\n" if rule == "start" else f"start: {rule}\n{rule}: {words}\n"


def nested_schema(levels: int) -> str:
    head = '{"type": "object", "properties": {"a": ' * levels
    return head + '{"type": "integer"}' + "}}" * levels


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.stack


@pytest.fixture(scope="module")
def wide_stack(shared_stack, tmp_path_factory: pytest.TempPathFactory):
    """A stack of the shared stack's model that takes grammars up to
    :data:`WIDE_MAX_GRAMMAR_BYTES`."""
    with running_stack(
        shared_stack.model_dir,
        tmp_path_factory.mktemp("wide-logs"),
        max_grammar_bytes=WIDE_MAX_GRAMMAR_BYTES,
    ) as stack:
        yield stack


def compile_seconds(model_dir: Path, constraint: StructuredOutput) -> float:
    """How long the scheduler's compile of ``constraint`` takes here, now: the same
    :class:`GrammarBackend` over the served model's tokenizer, in this process."""
    config = json.loads((model_dir / "config.json").read_text())
    eos = config["eos_token_id"]
    backend = GrammarBackend(
        (model_dir / "tokenizer.json").read_text(),
        config["vocab_size"],
        eos if isinstance(eos, list) else [eos],
    )
    try:
        backend.tokenizer()
        started = time.perf_counter()
        backend.compile(constraint).result()
        return time.perf_counter() - started
    finally:
        backend.close()


class Ticker:
    """Streams greedy tokens, one stream after another, until :meth:`stop`; :attr:`arrivals`
    are the times its tokens arrived (one GenerateStream message per engine step)."""

    def __init__(self, stub) -> None:
        self._stub = stub
        self._stopped = threading.Event()
        self._call = None
        self.arrivals: list[float] = []
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._call = self._stub.GenerateStream(
                pb.GenerateRequest(
                    prompt_token_ids=pb.TokenIds(ids=PROMPT_IDS),
                    max_new_tokens=2000,
                    ignore_eos=True,
                    cache_salt="large-grammar-stream",
                ),
                timeout=120,
            )
            try:
                for _ in self._call:
                    self.arrivals.append(time.perf_counter())
                    if len(self.arrivals) == 5:
                        self.started.set()
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.CANCELLED

    def stop(self) -> None:
        self._stopped.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join()

    def longest_gap_s(self, start: float, end: float) -> tuple[float, int]:
        """The longest time between two tokens from the last one before ``start`` to the first
        after ``end``, and how many arrived in between."""
        window = [t for t in self.arrivals if start <= t <= end]
        before = max(t for t in self.arrivals if t < start)
        after = min(t for t in self.arrivals if t > end)
        times = [before, *window, after]
        return max(b - a for a, b in zip(times, times[1:], strict=False)), len(window)


def test_a_large_grammar_compiles_without_holding_up_another_stream(wide_stack) -> None:
    grammar = alternatives(NUM_ALTERNATIVES, "WORD")
    model_dir = Path(wide_stack.config.model_dir)
    compile_s = compile_seconds(model_dir, StructuredOutput("grammar", grammar))
    stub = text_stub(wide_stack)
    ticker = Ticker(stub)
    try:
        assert ticker.started.wait(60)
        sent = time.perf_counter()
        answer = stub.Generate(
            pb.GenerateRequest(
                prompt_token_ids=pb.TokenIds(ids=PROMPT_IDS),
                max_new_tokens=8,
                structured_output=pb.StructuredOutput(grammar=grammar),
            ),
            timeout=120,
        )
        answered = time.perf_counter()
        while ticker.arrivals[-1] <= answered:
            time.sleep(0.001)  # NOTE: the next token of a stream that runs: a step away
    finally:
        ticker.stop()
    assert answer.text in {f"w{i}x" for i in range(NUM_ALTERNATIVES)}
    longest_gap_s, num_tokens = ticker.longest_gap_s(sent, answered)
    print(
        f"\ncompile {compile_s * 1e3:.0f} ms; constrained request answered in "
        f"{(answered - sent) * 1e3:.0f} ms; {num_tokens} tokens of the other stream meanwhile, "
        f"longest gap {longest_gap_s * 1e3:.1f} ms"
    )
    # NOTE: on the step loop the stream waited for the whole compile (gap 1.25 s of 1.56 s);
    # off it the gap is scheduling noise: 55-73 ms quiet, 170-190 ms beside a busy process on 2
    # cores, for a ~600 ms compile, but 374 ms in a full suite beside a busy process (the compile
    # here 699 ms, in the stack the request took 2667 ms). The constrained request's own time
    # includes the stack's compile under the same load, so half of it (or of the compile here,
    # whichever is longer) tells the two apart on a loaded machine too.
    assert longest_gap_s < max(compile_s, answered - sent) / 2


def logs_since(stack, sizes: dict[str, int]) -> dict[str, str]:
    """What each layer's log got since ``sizes`` (bytes at the start)."""
    out = {}
    for name, size in sizes.items():
        with open(Path(stack.config.log_dir) / f"{name}.log", "rb") as log:
            log.seek(size)
            out[name] = log.read().decode(errors="replace")
    return out


def log_sizes(stack) -> dict[str, int]:
    names = ("frontend", "scheduler")
    return {n: (Path(stack.config.log_dir) / f"{n}.log").stat().st_size for n in names}


REFUSED = [
    pytest.param(
        pb.StructuredOutput(grammar=alternatives(50_000)), "bytes; at most 131072", id="large"
    ),
    pytest.param(
        pb.StructuredOutput(json_schema=nested_schema(3000)), "nested more than 64", id="deep"
    ),
    pytest.param(
        pb.StructuredOutput(json_schema=json.dumps({"$ref": "#"})), "not servable", id="self"
    ),
    pytest.param(
        pb.StructuredOutput(grammar=alternatives(3000)), "failed while generating", id="wide"
    ),
    pytest.param(
        pb.StructuredOutput(grammar="start: " + "(" * 3000 + '"a"' + ")" * 3000),
        "too deeply nested",
        id="deep-lark",
    ),
]


@pytest.mark.parametrize(("constraint", "words"), REFUSED)
def test_a_refused_constraint_is_invalid_argument_in_a_few_words(stack, constraint, words) -> None:
    sizes = log_sizes(stack)
    kind = constraint.WhichOneof("constraint")
    with pytest.raises(grpc.RpcError) as info:
        text_stub(stack).Generate(
            pb.GenerateRequest(
                prompt_token_ids=pb.TokenIds(ids=PROMPT_IDS),
                max_new_tokens=4,
                structured_output=constraint,
            ),
            timeout=60,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details()
    assert details.startswith(f"structured_output.{kind}: ")
    assert words in details
    assert len(details) <= MAX_MESSAGE_CHARS
    for name, text in logs_since(stack, sizes).items():
        assert "Traceback" not in text and " ERROR " not in text, name
        assert len(text) < 2000, name


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "#"}, "not servable"),
        ({"enum": ["x" * 140_000]}, "bytes; at most 131072"),
    ],
)
def test_over_http_a_refused_schema_is_a_400_naming_response_format(stack, schema, words) -> None:
    host, _, port = stack.config.http_listen.rpartition(":")
    client = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
    error = info.value.body
    assert error["param"] == "response_format"
    assert words in error["message"]
    assert len(error["message"]) <= MAX_MESSAGE_CHARS
