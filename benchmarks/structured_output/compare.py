"""Micro-benchmark: structured output, llguidance against xgrammar, and the engine's per-token cost.

Part 1 (the libraries, on one thread of this process): for each tokenizer, stories260K's (512
tokens) and a 32k byte-level BPE trained here on the Python standard library's sources (no larger
tokenizer.json is available offline), the time to build the library's tokenizer, to compile a
JSON schema (median of 5, caches off), and per token of one valid compact document: the mask of
the next token and consuming it. Also the import time (a fresh interpreter) and the installed size
of each package. Part 2 (the engine): stories260K in this process, 8 greedy requests of 128 tokens
decoded together, free and constrained (a regex, then the JSON schema at temperature 1), in decode
tokens per second, and how long the sampler waited on masks. Run:
``python -m benchmarks.structured_output.compare [--skip-engine]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
        },
        "status": {"enum": ["active", "inactive", "banned"]},
        "score": {"type": "number"},
    },
    "required": ["id", "name", "email", "tags", "address", "status", "score"],
}
DOCUMENT = {
    "id": 4217,
    "name": "Lily and the big red ball",
    "email": "lily@example.com",
    "tags": ["park", "friends", "sunny day", "happy"],
    "address": {"street": "12 Oak Lane", "city": "Springfield", "zip": "12345"},
    "status": "active",
    "score": 97.5,
}
BPE_VOCAB_SIZE = 32000


def bpe_tokenizer(path: Path) -> str:
    """A 32k byte-level BPE tokenizer.json trained on the standard library's sources (cached)."""
    if not path.exists():
        from tokenizers import decoders as dec
        from tokenizers import models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = dec.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=BPE_VOCAB_SIZE,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = [str(p) for p in sorted(stdlib.rglob("*.py"))[:1500] if _is_utf8(p)]
        tok.train(files, trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
    return path.read_text()


def _is_utf8(path: Path) -> bool:
    try:
        path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    return True


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def per_token(masks: list[float], consumes: list[float]) -> dict[str, float]:
    return {
        "mask_us_median": statistics.median(masks) * 1e6,
        "mask_us_mean": statistics.fmean(masks) * 1e6,
        "consume_us_median": statistics.median(consumes) * 1e6,
    }


def bench_llguidance(tokenizer_json: str, vocab_size: int, eos: int, ids: list[int]) -> dict:
    from llguidance import LLMatcher, LLTokenizer

    build_s, tok = timed(lambda: LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos))
    grammar = LLMatcher.grammar_from_json_schema(SCHEMA, overrides={"whitespace_flexible": False})
    compiles = [timed(lambda: LLMatcher(tok, grammar))[0] for _ in range(5)]
    matcher = LLMatcher(tok, grammar)
    masks, consumes = [], []
    for token_id in ids:
        elapsed, bits = timed(matcher.compute_bitmask)
        masks.append(elapsed)
        assert np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little")[token_id]
        elapsed, ok = timed(lambda t=token_id: matcher.consume_token(t))
        assert ok, matcher.get_error()
        consumes.append(elapsed)
    assert matcher.is_accepting()
    return {
        "tokenizer_build_ms": build_s * 1e3,
        "compile_ms": statistics.median(compiles) * 1e3,
        **per_token(masks, consumes),
    }


def bench_xgrammar(tokenizer_json: str, vocab_size: int, eos: int, ids: list[int]) -> dict:
    import torch
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
    build_s, info = timed(
        lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=[eos])
    )

    def compile_once() -> object:
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return compiler.compile_json_schema(SCHEMA, any_whitespace=False, separators=(",", ":"))

    compiles = [timed(compile_once)[0] for _ in range(5)]
    matcher = xgr.GrammarMatcher(compile_once())
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    masks, consumes = [], []
    for token_id in ids:
        elapsed, _ = timed(lambda: matcher.fill_next_token_bitmask(bitmask))
        masks.append(elapsed)
        assert (int(bitmask[0, token_id // 32]) >> (token_id % 32)) & 1
        elapsed, ok = timed(lambda t=token_id: matcher.accept_token(t))
        assert ok
        consumes.append(elapsed)
    assert matcher.accept_token(eos) and torch is not None
    return {
        "tokenizer_build_ms": build_s * 1e3,
        "compile_ms": statistics.median(compiles) * 1e3,
        **per_token(masks, consumes),
    }


def package_facts(name: str) -> dict:
    """Installed size of the distribution's own files, its requirements, and the seconds a fresh
    interpreter takes to import it."""
    dist = importlib.metadata.distribution(name)
    size = sum(f.locate().stat().st_size for f in dist.files or () if f.locate().exists())
    code = f"import time; t = time.perf_counter(); import {name}; print(time.perf_counter() - t)"
    runs = [float(subprocess.check_output([sys.executable, "-c", code])) for _ in range(3)]
    return {
        "version": dist.version,
        "installed_mb": size / 1e6,
        "requires": [r.split(";")[0].strip() for r in dist.requires or () if "extra" not in r],
        "import_ms": statistics.median(runs) * 1e3,
    }


def libraries(cache: Path) -> dict:
    from zerolayer.checkpoints.default_model import ensure_default_model

    stories = (ensure_default_model() / "tokenizer.json").read_text()
    tokenizers = {
        "stories260K (512)": (stories, 512, 2),
        "byte-level BPE (32k)": (bpe_tokenizer(cache / "bpe32k.json"), BPE_VOCAB_SIZE, 0),
    }
    text = json.dumps(DOCUMENT, separators=(",", ":"))
    results: dict = {"packages": {n: package_facts(n) for n in ("llguidance", "xgrammar")}}
    for label, (tokenizer_json, vocab_size, eos) in tokenizers.items():
        ids = Tokenizer.from_str(tokenizer_json).encode(text, add_special_tokens=False).ids
        if label.startswith("stories"):
            ids = ids[1:] if Tokenizer.from_str(tokenizer_json).id_to_token(ids[0]) == " " else ids
        results[label] = {
            "document_tokens": len(ids),
            "llguidance": bench_llguidance(tokenizer_json, vocab_size, eos, ids),
            "xgrammar": bench_xgrammar(tokenizer_json, vocab_size, eos, ids),
        }
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "zerolayer" / "bench")
    p.add_argument("--skip-engine", action="store_true", help="only the library comparison")
    args = p.parse_args()
    results = libraries(args.cache)
    if not args.skip_engine:
        from benchmarks.structured_output.engine import engine_overhead

        results["engine (stories260K, CPU, 8 x 128 tokens)"] = engine_overhead()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
