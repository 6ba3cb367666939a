"""The streamed delta chunk's fast encoding (ResponseShape.delta_json) gives the bytes of json.dumps of the
whole chunk body, for both kinds, any text and any model name."""

from __future__ import annotations

import json

import pytest

from zipkv.controlplane.openai_api import ResponseShape

TEXTS = ["h", "", 'q"uo\\te\n\t', "é漢字😀", "\x00\u2028\x7f", "<text 0>"]


@pytest.mark.parametrize("kind", ["text", "chat"])
@pytest.mark.parametrize("model", ["zipkv-tiny", 'we"ird é <text 0>'])
def test_delta_json_is_the_chunk_as_compact_json(kind: str, model: str) -> None:
    fast, slow = ResponseShape(kind, model, "abc"), ResponseShape(kind, model, "abc")  # type: ignore[arg-type]
    slow.created = fast.created
    for text in TEXTS:  # the first chat chunk carries the role; the rest share one frame
        assert fast.delta_json(text) == json.dumps(slow.chunk(text, None), separators=(",", ":")).encode()
