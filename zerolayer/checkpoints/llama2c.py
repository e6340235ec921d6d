"""Convert a llama2.c checkpoint and tokenizer into a standard Hugging Face Llama directory.

Source: Karpathy's llama2.c (``run.c``: ``read_checkpoint``, ``build_tokenizer``, ``encode``,
``decode``; ``export.py``: ``legacy_export``). Only the legacy "version 0" checkpoint layout is
read: 7 little-endian int32 header fields (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
vocab_size, seq_len), then float32 arrays, each matrix row-major as (out_features, in_features)
with all layers stacked: token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3,
rms_final, freq_cis_real, freq_cis_imag and, only when the header's vocab_size is negative, the
classifier. The tokenizer ``.bin`` is an int32 max_token_length, then per piece a float32 score,
an int32 byte length and the piece bytes (sentencepiece's ``▁`` already replaced by a space).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from zerolayer.checkpoints.model_files import make_model_dir, share_model_files
from zerolayer.checkpoints.score_merges import merges_by_score

HEADER_FORMAT = "<7i"
HEADER_BYTES = struct.calcsize(HEADER_FORMAT)
VERSIONED_MAGIC = 0x616B3432  # "ak42": llama2.c's version 1/2 export formats, not supported here
SPECIAL_PIECES = ("<unk>", "<s>", "</s>")


class Llama2cInputError(ValueError):
    """An input of :func:`convert_llama2c` cannot be read or is not what it must be; the message
    names the argument and the path (``checkpoint /x.bin: ...``)."""

    def __init__(self, argument: str, path: Path, reason: str) -> None:
        super().__init__(f"{argument} {path}: {reason}")
        self.argument = argument
        """``checkpoint``, ``tokenizer`` or ``out_dir``."""
        self.reason = reason
        """Why, without the argument and path."""


BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
NUM_BYTE_PIECES = 256
BYTE_PIECE_OFFSET = len(SPECIAL_PIECES)  # run.c's byte fallback: id = byte + 3
MIN_MERGE_SCORE = -1e10  # run.c starts its best-score search here, so lower scores never merge


@dataclass(frozen=True)
class Llama2cHeader:
    """Hyperparameters from a legacy llama2.c checkpoint header."""

    dim: int
    """Residual stream width (hidden_size)."""
    hidden_dim: int
    """SwiGLU FFN width (intermediate_size)."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Number of query heads."""
    n_kv_heads: int
    """Number of key/value heads (grouped-query attention when below n_heads)."""
    vocab_size: int
    """Number of tokens, always positive (the file's sign is ``shared_classifier``)."""
    seq_len: int
    """Maximum sequence length in tokens (max_position_embeddings)."""
    shared_classifier: bool
    """True when the classifier is the token embedding (positive vocab_size in the file)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.head_dim * self.n_kv_heads

    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        """Names and shapes of the float32 arrays after the header, in file order."""
        d, h, kv, n = self.dim, self.hidden_dim, self.kv_dim, self.n_layers
        arrays = [
            ("token_embedding", (self.vocab_size, d)),
            ("rms_att", (n, d)),
            ("wq", (n, d, d)),
            ("wk", (n, kv, d)),
            ("wv", (n, kv, d)),
            ("wo", (n, d, d)),
            ("rms_ffn", (n, d)),
            ("w1", (n, h, d)),
            ("w2", (n, d, h)),
            ("w3", (n, h, d)),
            ("rms_final", (d,)),
            ("freq_cis_real", (self.seq_len, self.head_dim // 2)),
            ("freq_cis_imag", (self.seq_len, self.head_dim // 2)),
        ]
        if not self.shared_classifier:
            arrays.append(("wcls", (self.vocab_size, d)))
        return arrays

    def file_bytes(self) -> int:
        """Exact size in bytes of a checkpoint with this header."""
        return HEADER_BYTES + 4 * sum(prod(shape) for _, shape in self.layout())


def parse_header(raw: bytes) -> Llama2cHeader:
    """Parse and validate the first ``HEADER_BYTES`` bytes of a legacy llama2.c checkpoint.

    Raises:
        ValueError: fewer than 28 bytes, a versioned (``ak42``) export, or inconsistent sizes.
    """
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"llama2.c checkpoint truncated: {len(raw)} bytes, header needs 28")
    fields = struct.unpack_from(HEADER_FORMAT, raw)
    if fields[0] == VERSIONED_MAGIC:
        raise ValueError(
            "versioned llama2.c checkpoint (magic 'ak42') is not supported; use the "
            "legacy version 0 export"
        )
    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len = fields
    header = Llama2cHeader(*fields[:5], abs(vocab_size), seq_len, vocab_size > 0)
    if min(dim, hidden_dim, n_layers, n_heads, n_kv_heads, abs(vocab_size), seq_len) <= 0:
        raise ValueError(f"llama2.c checkpoint header has a non-positive size: {fields}")
    if dim % n_heads or n_heads % n_kv_heads or header.head_dim % 2:
        raise ValueError(
            f"llama2.c checkpoint header has inconsistent head sizes: dim={dim}, "
            f"n_heads={n_heads}, n_kv_heads={n_kv_heads} (head_dim must be even)"
        )
    return header


def read_checkpoint(path: Path) -> tuple[Llama2cHeader, dict[str, np.ndarray]]:
    """Read a legacy llama2.c checkpoint (memory-mapped, read-only).

    Returns the header and the arrays named and shaped as in ``Llama2cHeader.layout``, float32.
    Raises:
        ValueError: the header is invalid or the file size differs from what the header implies.
    """
    with path.open("rb") as f:
        header = parse_header(f.read(HEADER_BYTES))
    size = path.stat().st_size
    if size != header.file_bytes():
        raise ValueError(
            f"llama2.c checkpoint {path} has {size} bytes, but its header {header} "
            f"implies {header.file_bytes()} (truncated or not a legacy checkpoint)"
        )
    flat = np.memmap(path, dtype="<f4", mode="r", offset=HEADER_BYTES)
    arrays, start = {}, 0
    for name, shape in header.layout():
        arrays[name] = flat[start : start + prod(shape)].reshape(shape)
        start += prod(shape)
    return header, arrays


def permute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reorder the rows of a Q or K projection from llama2.c's RoPE layout to Hugging Face's.

    llama2.c (like Meta's original Llama code) rotates adjacent pairs of each head, rows
    (2i, 2i+1) with frequency theta^(-2i/head_dim); Hugging Face's ``rotate_half`` pairs row i
    with row i + head_dim/2 at that same frequency. Moving each head's even rows to its first
    half and its odd rows to its second half (rows [0, 2, 4, ..., 1, 3, 5, ...]) makes the two
    rotations identical, so attention scores (q . k) are unchanged. Same permutation as
    transformers' ``convert_llama_weights_to_hf.permute``.

    Args:
        weight: (num_heads * head_dim, in_features) float32.
    Returns:
        A new array of the same shape and dtype.
    """
    out_features, in_features = weight.shape
    head_dim = out_features // num_heads
    pairs = weight.reshape(num_heads, head_dim // 2, 2, in_features)  # (head, i, even/odd, in)
    return np.ascontiguousarray(pairs.transpose(0, 2, 1, 3)).reshape(out_features, in_features)


def to_hf_tensors(header: Llama2cHeader, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map llama2.c arrays to Hugging Face ``LlamaForCausalLM`` tensor names (float32, C order).

    The RoPE tables are dropped (transformers recomputes them); ``lm_head.weight`` is present only
    when the classifier is not shared.
    """
    tensors = {"model.embed_tokens.weight": arrays["token_embedding"]}
    for i in range(header.n_layers):
        prefix = f"model.layers.{i}."
        tensors |= {
            prefix + "input_layernorm.weight": arrays["rms_att"][i],
            prefix + "self_attn.q_proj.weight": permute_rope_rows(arrays["wq"][i], header.n_heads),
            prefix + "self_attn.k_proj.weight": permute_rope_rows(
                arrays["wk"][i], header.n_kv_heads
            ),
            prefix + "self_attn.v_proj.weight": arrays["wv"][i],
            prefix + "self_attn.o_proj.weight": arrays["wo"][i],
            prefix + "post_attention_layernorm.weight": arrays["rms_ffn"][i],
            prefix + "mlp.gate_proj.weight": arrays["w1"][i],
            prefix + "mlp.down_proj.weight": arrays["w2"][i],
            prefix + "mlp.up_proj.weight": arrays["w3"][i],
        }
    tensors["model.norm.weight"] = arrays["rms_final"]
    if not header.shared_classifier:
        tensors["lm_head.weight"] = arrays["wcls"]
    return {name: np.ascontiguousarray(t, dtype=np.float32) for name, t in tensors.items()}


def read_tokenizer(path: Path, vocab_size: int) -> tuple[list[str], list[float]]:
    """Read a llama2.c ``tokenizer.bin`` holding exactly ``vocab_size`` pieces.

    Returns the pieces as Hugging Face vocab strings (ids 0..2 renamed to ``<unk>``, ``<s>``,
    ``</s>``; spaces kept as plain spaces) and their float32 merge scores, both indexed by id.
    Raises:
        ValueError: truncated file, extra trailing bytes, a piece that is not UTF-8, byte pieces
            missing from ids 3..258, or duplicate pieces.
    """
    raw = path.read_bytes()
    if len(raw) < 4 or struct.unpack_from("<i", raw)[0] <= 0:
        raise ValueError(f"llama2.c tokenizer {path} lacks a positive max_token_length")
    pieces, scores, offset = [], [], 4
    for token_id in range(vocab_size):
        if offset + 8 > len(raw):
            raise ValueError(f"llama2.c tokenizer {path} truncated at piece {token_id}")
        score, length = struct.unpack_from("<fi", raw, offset)
        piece = raw[offset + 8 : offset + 8 + length]
        if length < 0 or len(piece) != length:
            raise ValueError(f"llama2.c tokenizer {path} truncated at piece {token_id}")
        try:
            pieces.append(piece.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"llama2.c tokenizer piece {token_id} is not UTF-8: {piece!r}") from e
        scores.append(score)
        offset += 8 + length
    if offset != len(raw):
        raise ValueError(
            f"llama2.c tokenizer {path} has {len(raw) - offset} bytes after "
            f"{vocab_size} pieces: does it belong to this checkpoint?"
        )
    return _checked_pieces(pieces), scores


def _checked_pieces(pieces: list[str]) -> list[str]:
    """Rename the special pieces and check the byte pieces and uniqueness (see read_tokenizer)."""
    num_fixed = BYTE_PIECE_OFFSET + NUM_BYTE_PIECES
    if len(pieces) < num_fixed:
        raise ValueError(f"llama2.c tokenizer has {len(pieces)} pieces, needs at least {num_fixed}")
    for byte in range(NUM_BYTE_PIECES):
        if pieces[BYTE_PIECE_OFFSET + byte] != f"<0x{byte:02X}>":
            raise ValueError(
                f"llama2.c tokenizer id {BYTE_PIECE_OFFSET + byte} should be the "
                f"byte piece <0x{byte:02X}>, got {pieces[BYTE_PIECE_OFFSET + byte]!r}"
            )
    renamed = list(SPECIAL_PIECES) + pieces[BYTE_PIECE_OFFSET:]
    if len(set(renamed)) != len(renamed):
        raise ValueError("llama2.c tokenizer has duplicate pieces; a tokenizers vocab cannot")
    return renamed


def derive_merges(pieces: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges equivalent to run.c's ``encode`` merge loop, highest priority first.

    run.c repeatedly merges the adjacent pair whose concatenated string is a vocab piece with the
    highest score. So every split of a non-special piece into two non-special pieces is a merge,
    ranked by the piece's score (:func:`~zerolayer.checkpoints.score_merges.merges_by_score`);
    pieces scored at or below run.c's starting best score never merge. Byte pieces take part
    under their ``<0xHH>`` spelling, exactly as run.c concatenates them.
    """
    return merges_by_score(pieces, scores, lambda i: i >= BYTE_PIECE_OFFSET, MIN_MERGE_SCORE)


def build_tokenizer(pieces: list[str], scores: list[float]) -> Tokenizer:
    """A ``tokenizers`` BPE tokenizer that encodes and decodes like llama2.c's run.c.

    Encoding: prepend one space to non-empty text (run.c's dummy prefix), look up each character,
    fall back to ``<0xHH>`` byte pieces, merge by ``derive_merges``; ``add_special_tokens=True``
    adds ``<s>`` (id 1) in front. Decoding: byte pieces become bytes, and one leading space of the
    text is dropped (run.c drops the space of the piece after BOS).
    """
    vocab = {piece: i for i, piece in enumerate(pieces)}
    bpe = models.BPE(
        vocab=vocab,
        merges=derive_merges(pieces, scores),
        unk_token=SPECIAL_PIECES[0],
        byte_fallback=True,
        ignore_merges=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Prepend(" ")
    tokenizer.add_special_tokens(
        [AddedToken(p, special=True, normalized=False) for p in SPECIAL_PIECES]
    )
    bos = SPECIAL_PIECES[BOS_TOKEN_ID]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, BOS_TOKEN_ID)]
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)]
    )
    return tokenizer


def hf_config(header: Llama2cHeader) -> dict:
    """The ``config.json`` contents of a float32 ``LlamaForCausalLM`` with this header's sizes."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": header.dim,
        "intermediate_size": header.hidden_dim,
        "num_hidden_layers": header.n_layers,
        "num_attention_heads": header.n_heads,
        "num_key_value_heads": header.n_kv_heads,
        "head_dim": header.head_dim,
        "vocab_size": header.vocab_size,
        "max_position_embeddings": header.seq_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": header.shared_classifier,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def _reason(exc: Exception) -> str:
    """An input's error without the path (an OSError's ``strerror``: the path is said apart)."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def convert_llama2c(checkpoint: Path, tokenizer: Path, out_dir: Path) -> None:
    """Write a Hugging Face Llama directory for a llama2.c checkpoint and tokenizer.

    Writes into ``out_dir`` (created if missing; an existing one must be empty): ``config.json``,
    ``generation_config.json``, ``model.safetensors`` (float32), ``tokenizer.json`` and
    ``tokenizer_config.json``, all 0644; directories created for it are 0755
    (:mod:`zerolayer.checkpoints.model_files`). Both inputs are fully validated before anything is
    written.

    Raises:
        Llama2cInputError: a missing, unreadable, malformed or truncated checkpoint or tokenizer
            file (a tokenizer given as the checkpoint: its header makes no sense); an
            ``out_dir`` that is there and is not an empty directory (nothing is overwritten,
            as ``zerolayer quantize`` refuses one).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise Llama2cInputError("out_dir", out_dir, "exists and is not an empty directory")
    try:
        header, arrays = read_checkpoint(Path(checkpoint))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, ValueError):
            reason += (
                " (not a llama2.c model checkpoint; the order is CHECKPOINT TOKENIZER OUT_DIR)"
            )
        raise Llama2cInputError("checkpoint", Path(checkpoint), reason) from None
    try:
        pieces, scores = read_tokenizer(Path(tokenizer), header.vocab_size)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise Llama2cInputError("tokenizer", Path(tokenizer), reason) from None
    hf_tokenizer = build_tokenizer(pieces, scores)
    tensors = to_hf_tensors(header, arrays)
    make_model_dir(out_dir)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out_dir / "config.json", hf_config(header))
    _write_json(
        out_dir / "generation_config.json",
        # NOTE: llama2.c's run.c also stops at BOS (id 1), which its models emit between stories.
        {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": [EOS_TOKEN_ID, BOS_TOKEN_ID]},
    )
    hf_tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": SPECIAL_PIECES[BOS_TOKEN_ID],
            "eos_token": SPECIAL_PIECES[EOS_TOKEN_ID],
            "unk_token": SPECIAL_PIECES[0],
            "model_max_length": header.seq_len,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    share_model_files(out_dir)
