"""The tool-call formats of the model families zerolayer serves, and which one a chat template
writes.

Each format is how a family's model writes its calls in plain text (as its published chat template
renders an assistant message's ``tool_calls``, and as vLLM's and SGLang's parsers of the same name
read them):

- ``hermes`` (Hermes 2 Pro / 3, Qwen2.5, Qwen3): each call a JSON object ``{"name": ...,
  "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``, the calls one after another.
- ``llama3_json`` (Llama 3.1 / 3.2 / 3.3, JSON-based tool calling,
  https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_1/): the whole answer is
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several calls
  separated by ``;``.
- ``mistral`` (Mistral 7B v0.3, Mistral Nemo, Mixtral 8x22B: the v3 tokenizers): ``[TOOL_CALLS]``
  then a JSON array of ``{"name": ..., "arguments": {...}}``. ``[TOOL_CALLS]`` is a special token
  of those tokenizers (the frontend's detokenizer keeps a format's markers); an answer that
  starts with the array is taken as its calls too.

The format is chosen from what the template writes (:func:`format_of_template`), or by the
``--tool-call-parser`` flag; never from the model's name.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

PARSER_NAMES = ("hermes", "llama3_json", "mistral")
"""The formats :func:`tool_format` knows (the flag's values besides "auto" and "none")."""


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes tool calls."""

    name: str
    """One of :data:`PARSER_NAMES`."""
    markers: tuple[str, ...]
    """Texts that start the calls (the answer's text before them is content)."""
    arguments_key: str
    """The key of a call object that holds the arguments."""
    leading: str = ""
    """An answer that starts with this and then a JSON object whose first key is "name" is
    calls: "{" (Llama's JSON), "[" (Mistral's array without its ``[TOOL_CALLS]``); "": none."""
    grammar_open: str = ""
    """What a constrained answer writes before its calls (a Lark string literal's content)."""
    grammar_between: str = ""
    """What it writes between two calls."""
    grammar_close: str = ""
    """What it writes after its calls."""
    call_open: str = ""
    """What it writes before each call."""
    call_close: str = ""
    """What it writes after each call."""
    id_alphabet: str = string.ascii_letters + string.digits
    id_prefix: str = "call_"
    id_length: int = 24

    def new_call_id(self) -> str:
        """A fresh id for a parsed call (Mistral's templates take 9 letters and digits only)."""
        body = "".join(secrets.choice(self.id_alphabet) for _ in range(self.id_length))
        return self.id_prefix + body


FORMATS = {
    "hermes": ToolFormat(
        "hermes",
        ("<tool_call>",),
        "arguments",
        grammar_between="\n",
        call_open="<tool_call>\n",
        call_close="\n</tool_call>",
    ),
    "llama3_json": ToolFormat(
        "llama3_json",
        ("<|python_tag|>",),
        "parameters",
        leading="{",
        grammar_between="; ",
    ),
    "mistral": ToolFormat(
        "mistral",
        ("[TOOL_CALLS]",),
        "arguments",
        leading="[",
        grammar_open="[TOOL_CALLS][",
        grammar_between=", ",
        grammar_close="]",
        id_prefix="",
        id_length=9,
    ),
}
"""Each format by name."""


def format_of_template(source: str) -> ToolFormat | None:
    """The format a chat template writes an assistant's ``tool_calls`` in, found in its text:
    ``[TOOL_CALLS]`` (mistral), ``<tool_call>`` (hermes), a ``"parameters"`` object or
    ``<|python_tag|>`` beside ``tool_call`` (llama3_json); None: it renders no tool calls."""
    if "[TOOL_CALLS]" in source:
        return FORMATS["mistral"]
    if "<tool_call>" in source:
        return FORMATS["hermes"]
    if "tool_call" in source and ('"parameters": ' in source or "<|python_tag|>" in source):
        return FORMATS["llama3_json"]
    return None


def tool_format(flag: str, template_source: str) -> ToolFormat | None:
    """The format of ``--tool-call-parser`` ``flag``: "auto" the template's
    (:func:`format_of_template`), "none" none, else the named one."""
    if flag == "none":
        return None
    if flag == "auto":
        return format_of_template(template_source)
    return FORMATS[flag]
