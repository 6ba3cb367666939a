"""Tokenisers: the built-in byte tokenizer (ids documented), a local tokenizer.json, incremental text."""

from __future__ import annotations

import json
from pathlib import Path

from zipkv.controlplane.tokenizer import ByteTokenizer, HFTokenizer, IncrementalDetokenizer, load_tokenizer


def test_byte_tokenizer_ids() -> None:
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (259, 256, 257, 258)
    assert tok.encode("hé") == [256, 104, 0xC3, 0xA9]
    assert tok.encode("a", add_bos=False) == [97]
    assert tok.decode([256, 104, 0xC3, 0xA9, 257, 258]) == "hé"


def test_byte_chat_template() -> None:
    tok = ByteTokenizer()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "system: be brief\nuser: hi\nassistant: "
    assert tok.chat_ids(msgs)[0] == 256


def test_incremental_detokenizer_holds_back_split_characters() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    ids = tok.encode("a€b", add_bos=False)  # € is 3 bytes
    deltas = [detok.push([i]) for i in ids]
    assert deltas == ["a", "", "", "€", "b"]
    assert detok.flush() == ""
    detok2 = IncrementalDetokenizer(tok)
    assert detok2.push(ids[:2]) == ""  # a chunk ending mid-character is held back whole
    assert detok2.flush() == "a\ufffd"  # a truncated character is visible, not dropped silently


def _write_local_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "[UNK]": 2, "hello": 3, "world": 4, "user": 5, ":": 6}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": "</s>", "bos_token": {"content": "<s>"}})
    )


def test_local_tokenizer_json_and_chat_template(tmp_path: Path) -> None:
    _write_local_tokenizer(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("hello world") == [3, 4]
    assert tok.eos_token_id == 1
    assert tok.chat_ids([{"role": "user", "content": "hello"}]) == [5, 6, 3]
    assert tok.decode([3, 4]) == "hello world"
