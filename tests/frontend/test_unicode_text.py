"""Lone surrogates in a JSON body (zerolayer.frontend.unicode_text)."""

from __future__ import annotations

import json

import pytest

from zerolayer.common.errors import InvalidArgument
from zerolayer.frontend.unicode_text import check_unicode


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"prompt": "a\\ud800"}', "prompt"),
        ('{"messages": [{"role": "user", "content": "ok"}, {"content": "\\udfff"}]}',
         "messages[1].content"),
        ('{"logit_bias": {"\\ud800": 1}}', "logit_bias"),
        ('"\\ud800"', "request body"),
    ],
)  # fmt: skip
def test_the_first_lone_surrogate_is_refused_naming_its_field(body, field) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_unicode(json.loads(body))
    assert refused.value.field == field


def test_unicode_text_passes() -> None:
    check_unicode(json.loads('{"prompt": ["\\ud83d\\ude00 é", 1, null, {"a": [true]}]}'))
