"""Text tokenizer: a ``tokenizers.Tokenizer`` plus the BOS rules from tokenizer_config.json."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer

from zerolayer.checkpoints.byte_tokenizer import bytes_to_unicode
from zerolayer.checkpoints.tokenizer_files import parse_tokenizer_config

REPLACEMENT_CHAR = "\ufffd"
"""What one maximal invalid UTF-8 byte subsequence decodes to (U+FFFD)."""
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
"""A byte-fallback token, as the ``tokenizers`` ByteFallback decoder recognises one."""
SENTENCEPIECE_SPACE = "\u2581"
"""``▁``, the space of sentencepiece (Metaspace) pieces."""
_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}
"""GPT-2's byte table reversed: a byte-level piece's character -> its byte."""


class TextTokenizer:
    """Wraps a tokenizers.Tokenizer with the model's BOS rules.

    BOS rule for text prompts (``encode(text, add_special_tokens=True)``): the tokenizer.json
    post-processor runs first; if tokenizer_config.json says ``"add_bos_token": true`` and the
    result does not start with the BOS id, the BOS id is prepended (older Llama exports put the
    BOS rule only in the config, as ``LlamaTokenizer`` does). Otherwise the post-processor's
    output is trusted as is, including for ``"add_bos_token": false``.

    Truncation and padding settings stored in tokenizer.json are disabled: the frontend decides
    prompt length limits itself.
    """

    def __init__(
        self, tokenizer: Tokenizer, add_bos_token: bool | None, bos_token_id: int | None
    ) -> None:
        """Use :meth:`from_json`; this constructor takes the already-parsed parts.

        Args:
            tokenizer: the tokenizer; its truncation and padding are switched off in place.
            add_bos_token: tokenizer_config's ``add_bos_token``, or None when absent.
            bos_token_id: id of tokenizer_config's ``bos_token`` in the vocab, or None.
        """
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._add_bos_token = add_bos_token
        self._bos_token_id = bos_token_id
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        added = tokenizer.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, token in added.items() if token.special)
        self._special_by_text = {t.content: i for i, t in added.items() if t.special}
        decoder = json.dumps(json.loads(tokenizer.to_str()).get("decoder"))
        self._byte_fallback = '"type": "ByteFallback"' in decoder
        self._byte_level = '"type": "ByteLevel"' in decoder

    @classmethod
    def from_json(cls, tokenizer_json: str, tokenizer_config_json: str = "") -> TextTokenizer:
        """Build from the text of tokenizer.json and (optionally) tokenizer_config.json.

        Raises:
            ValueError: either text is not valid JSON, the config is not a JSON object, its
                ``add_bos_token`` is not a bool, or tokenizers rejects tokenizer.json.
        """
        try:
            json.loads(tokenizer_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"tokenizer_json: invalid JSON: {exc}") from exc
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception on a bad schema
            raise ValueError(f"tokenizer_json: not a valid tokenizer: {exc}") from exc
        config = parse_tokenizer_config(tokenizer_config_json)
        add_bos_token = config.get("add_bos_token")
        if add_bos_token is not None and not isinstance(add_bos_token, bool):
            raise ValueError(
                f"tokenizer_config_json: add_bos_token must be a bool: {add_bos_token!r}"
            )
        bos_token = special_token_content(config.get("bos_token"))
        bos_token_id = tokenizer.token_to_id(bos_token) if bos_token is not None else None
        return cls(tokenizer, add_bos_token, bos_token_id)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the BOS rule above applies."""
        token_ids = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        if (
            add_special_tokens
            and self._add_bos_token is True
            and self._bos_token_id is not None
            and token_ids[:1] != [self._bos_token_id]
        ):
            token_ids.insert(0, self._bos_token_id)
        return token_ids

    def decode(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        keep_special_ids: frozenset[int] = frozenset(),
    ) -> str:
        """Text of ``token_ids``, as ``tokenizers`` decodes it, except for invalid UTF-8.

        ``keep_special_ids``: special tokens whose text is kept although ``skip_special_tokens``
        drops the others (a tool-call format's marker, e.g. Mistral's ``[TOOL_CALLS]``).

        Invalid bytes: each maximal subpart of an ill-formed UTF-8 byte sequence (an incomplete
        tail included) decodes to one U+FFFD, the rest to its characters, as
        ``bytes.decode("utf-8", errors="replace")`` does (the Unicode Standard's "U+FFFD
        substitution of maximal subparts", ch. 3, "U+FFFD Substitution"). ByteLevel decoders
        (GPT-2 style) already do this; the ByteFallback decoder (``<0xNN>`` tokens, Llama 2,
        llama2.c) would turn a whole run of byte tokens into one U+FFFD per byte as soon as
        one byte of it is invalid, so that text already decoded could change as tokens are
        appended: here the run is split first, so a valid prefix never changes.

        Ids the tokenizer does not know are dropped (a model's vocab may be padded past the
        tokenizer's, so it can emit ids that have no text).
        """
        ids = [i for i in token_ids if self._known(i)]
        if skip_special_tokens and keep_special_ids:
            ids = [i for i in ids if i not in self._special_ids or i in keep_special_ids]
            skip_special_tokens = False
        if not self._byte_fallback:
            return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        tokens = [self._tokenizer.id_to_token(i) for i in ids]
        return self._tokenizer.decoder.decode(list(_split_invalid_bytes(tokens)))

    def special_token_ids(self, texts: Sequence[str]) -> frozenset[int]:
        """The ids of those of ``texts`` that are special tokens of the tokenizer."""
        return frozenset(self._special_by_text[t] for t in texts if t in self._special_by_text)

    def pieces(self, token_ids: Sequence[int]) -> list[str]:
        """The vocab string of each id (``id_to_token``), e.g. ``"Ġhi"`` or ``"▁the"``.

        Raises:
            ValueError: an id is outside ``[0, vocab_size)``.
        """
        return [self._tokenizer.id_to_token(token_id) for token_id in self._checked_ids(token_ids)]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for, as UTF-8 (a piece of a character, for a
        token that ends or starts inside one): a byte-level piece (``"Ġhi"``) mapped back
        through GPT-2's byte table, a byte-fallback ``<0xNN>`` its byte, sentencepiece's ``▁``
        a space; b"" for a special token (decoding skips it) and an id the tokenizer does not
        know."""
        if not self._known(token_id) or token_id in self._special_ids:
            return b""
        piece = self._tokenizer.id_to_token(token_id)
        if self._byte_level and all(c in _UNICODE_TO_BYTE for c in piece):
            return bytes(_UNICODE_TO_BYTE[c] for c in piece)
        if self._byte_fallback and _BYTE_TOKEN.fullmatch(piece):
            return bytes([int(piece[3:5], 16)])
        return piece.replace(SENTENCEPIECE_SPACE, " ").encode()

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included."""
        return self._vocab_size

    @property
    def bos_token_id(self) -> int | None:
        """Id of tokenizer_config's ``bos_token``; None if it names none or one not in the vocab."""
        return self._bos_token_id

    def _known(self, token_id: int) -> bool:
        return (
            0 <= token_id < self._vocab_size and self._tokenizer.id_to_token(token_id) is not None
        )

    def _checked_ids(self, token_ids: Sequence[int]) -> list[int]:
        ids = list(token_ids)
        for token_id in ids:
            if not self._known(token_id):
                raise ValueError(f"token_ids: id {token_id} is not in the vocab")
        return ids


def _split_invalid_bytes(tokens: Sequence[str]) -> Iterator[str]:
    """``tokens`` with each maximal invalid subpart of a run of byte tokens replaced by one
    U+FFFD token (which ends the run for the ByteFallback decoder); valid bytes stay as they are.
    """
    run: list[str] = []
    for token in [*tokens, ""]:
        if _BYTE_TOKEN.fullmatch(token):
            run.append(token)
            continue
        data = bytes(int(t[3:5], 16) for t in run)
        start = 0
        while start < len(data):
            try:
                data[start:].decode("utf-8")
                yield from run[start:]
                break
            except UnicodeDecodeError as exc:
                yield from run[start : start + exc.start]
                yield REPLACEMENT_CHAR
                start += exc.end
        run = []
        if token:
            yield token


def special_token_content(token: object) -> str | None:
    """A special token as tokenizer_config writes it: a string or an AddedToken dict."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return token["content"]
    return None
