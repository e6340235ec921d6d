"""Standard chat templates a model directory can be given, so that chat can be tried on a model
written here (``zerolayer make-dummy --chat-template chatml``) without downloading one."""

from __future__ import annotations

from pathlib import Path

from zerolayer.checkpoints.model_files import share_model_files

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, as SmolLM2's and Qwen2.5's templates render a conversation without tools: each message
as ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`` (any role, ``tool`` included), then
``<|im_start|>assistant\\n`` when a generation prompt is asked for."""

CHAT_TEMPLATES = {"chatml": CHATML}
"""Template by the name a command line gives it."""

TEMPLATE_FILE = "chat_template.jinja"
"""Where a model directory keeps its template (transformers' file since v4.47; it wins over
tokenizer_config.json's ``chat_template`` for transformers and for zerolayer's frontend)."""


def write_chat_template(model_dir: Path, name: str) -> Path:
    """Writes the template named ``name`` as ``model_dir/chat_template.jinja`` (mode 0644,
    replacing one that is there); returns its path.

    Raises:
        KeyError: ``name`` is not in :data:`CHAT_TEMPLATES`.
        OSError: the file cannot be written.
    """
    path = Path(model_dir) / TEMPLATE_FILE
    path.write_text(CHAT_TEMPLATES[name])
    share_model_files(Path(model_dir), (TEMPLATE_FILE,))
    return path
