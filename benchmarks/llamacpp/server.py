"""llama.cpp's ``llama-server`` as a serving baseline: started on a GGUF file, streamed over HTTP.

The server runs ``--parallel`` slots with continuous batching; each request sends its prompt as
token ids to ``POST /completion`` (greedy, EOS ignored, with or without its prompt cache) and
is timed as it streams (server-sent events, one per token, except that a token ending inside a UTF-8
character is sent with the next). The binary is ``--llama-server`` or found on PATH or
where ``scripts/build_llama_server.sh`` puts it.

Source: llama.cpp's ``tools/server/README.md`` (``/completion``, ``/health``).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zerolayer.bench.streams import TokenTimes, run_scheduled

HEALTH_TIMEOUT_S = 120.0
"""How long a starting server may take to load its model."""


def default_build_dir() -> Path:
    """Where ``scripts/build_llama_server.sh`` installs by default:
    ``$XDG_CACHE_HOME/zerolayer/llama-server`` (``~/.cache`` without XDG_CACHE_HOME)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "zerolayer" / "llama-server"


def find_llama_server(explicit: str | None) -> Path | None:
    """``explicit`` if given (even if missing, so the caller reports it), else ``llama-server``
    on PATH, else ``<default_build_dir()>/bin/llama-server`` if it exists, else None."""
    if explicit:
        return Path(explicit)
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    built = default_build_dir() / "bin" / "llama-server"
    return built if built.exists() else None


@dataclass(frozen=True)
class LlamaServerConfig:
    """How ``llama-server`` is started."""

    binary: Path
    gguf_path: Path
    port: int
    num_threads: int
    """``--threads`` and ``--threads-batch``."""
    num_slots: int
    """``--parallel``: requests decoded together."""
    max_seq_tokens: int
    """Context of one slot (prompt plus generated tokens)."""
    log_path: Path
    repack: bool = True
    """Weights repacked into the CPU backend's extra buffer types (llama.cpp's default); False
    adds ``--no-repack``."""
    cache_ram_mib: int | None = None
    """``--cache-ram``: MiB of host memory for the prompts of slots taken by other requests (its
    prompt cache, restored when a later prompt shares their prefix); None: llama-server's
    default."""

    def argv(self) -> list[str]:
        """The command line."""
        return [
            str(self.binary),
            *("--model", str(self.gguf_path), "--host", "127.0.0.1", "--port", str(self.port)),
            *("--threads", str(self.num_threads), "--threads-batch", str(self.num_threads)),
            *("--parallel", str(self.num_slots), "--cont-batching"),
            *("--ctx-size", str(self.num_slots * self.max_seq_tokens)),
            *(() if self.repack else ("--no-repack",)),
            *(() if self.cache_ram_mib is None else ("--cache-ram", str(self.cache_ram_mib))),
        ]


@dataclass(frozen=True)
class Completion:
    """One streamed completion of ``llama-server``."""

    times: TokenTimes
    cached_tokens: int
    """Prompt tokens the slot's KV already held (the final event's ``timings.cache_n``)."""


def _body(prompt: Sequence[int], max_new_tokens: int, cache_prompt: bool, stream: bool) -> dict:
    """A greedy ``/completion`` request for exactly ``max_new_tokens`` tokens of ``prompt``."""
    return {
        "prompt": list(prompt),
        "n_predict": max_new_tokens,
        "stream": stream,
        "temperature": 0.0,
        "ignore_eos": True,
        "cache_prompt": cache_prompt,
        "return_tokens": True,
    }


class LlamaServer:
    """A running ``llama-server`` process (a context manager: started on enter, terminated on
    exit)."""

    def __init__(self, config: LlamaServerConfig) -> None:
        self.config = config
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        self.config.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.config.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.config.argv(), stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_healthy()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {self._process.returncode}; see "
                    f"{self.config.log_path}"
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.config.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"llama-server not healthy in {HEALTH_TIMEOUT_S} s")

    def stream(self, prompt: Sequence[int], max_new_tokens: int) -> TokenTimes:
        """One streamed greedy completion of ``prompt`` (ids), timed per token, with no prompt
        cache.

        Raises:
            RuntimeError: an HTTP error, or not ``max_new_tokens`` tokens.
        """
        return self.complete(prompt, max_new_tokens, cache_prompt=False).times

    def complete(
        self, prompt: Sequence[int], max_new_tokens: int, cache_prompt: bool
    ) -> Completion:
        """One streamed greedy completion of ``prompt`` (ids): its tokens' arrival times and the
        prompt tokens the server reused. ``cache_prompt``: the server may reuse the KV of the slot
        it picks for the prompt's common prefix (llama-server's ``cache_prompt``).

        Raises:
            RuntimeError: an HTTP error, or not ``max_new_tokens`` tokens.
        """
        send = time.perf_counter()
        response = self._post(_body(prompt, max_new_tokens, cache_prompt, stream=True))
        arrivals: list[float] = []
        timings: dict = {}
        for line in response:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            # NOTE: a token that ends inside a UTF-8 character is held back and sent with the
            # next one, so the count of tokens so far, not the event, says how many arrived.
            num_new = event.get("tokens_predicted", 0) - len(arrivals)
            arrivals.extend([time.perf_counter()] * num_new)
            timings = event.get("timings") or timings
            if event.get("stop"):
                break
        response.close()
        if len(arrivals) != max_new_tokens:
            raise RuntimeError(f"llama-server streamed {len(arrivals)} of {max_new_tokens} tokens")
        return Completion(TokenTimes(send, tuple(arrivals)), timings.get("cache_n", 0))

    def greedy_ids(
        self, prompt: Sequence[int], max_new_tokens: int, cache_prompt: bool
    ) -> tuple[int, ...]:
        """The ids of one greedy completion of ``prompt``, not streamed.

        NOTE: a stream cannot give them: the ``tokens`` of its events leave out the tokens held
        back inside a UTF-8 character (seen with this build: 12 tokens predicted, 10 ids sent).

        Raises:
            RuntimeError: an HTTP error, or not ``max_new_tokens`` ids.
        """
        response = self._post(_body(prompt, max_new_tokens, cache_prompt, stream=False))
        token_ids = tuple(json.loads(response.read())["tokens"])
        if len(token_ids) != max_new_tokens:
            raise RuntimeError(f"llama-server returned {len(token_ids)} of {max_new_tokens} ids")
        return token_ids

    def _post(self, body: dict) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection("127.0.0.1", self.config.port, timeout=600)
        conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"llama-server: HTTP {response.status} {response.read()[:200]!r}")
        return response

    def run_scheduled(
        self, prompts: Sequence[Sequence[int]], offsets_s: Sequence[float], max_new_tokens: int
    ) -> list[TokenTimes]:
        """Sends prompt i ``offsets_s[i]`` seconds after the start, each on its own thread (the
        HTTP counterpart of :func:`zerolayer.bench.streams.run_streams`).

        Raises:
            RuntimeError: the first failed request's error, after all have ended.
        """
        return run_scheduled(lambda i: self.stream(prompts[i], max_new_tokens), offsets_s)
