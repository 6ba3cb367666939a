"""The byte tokenizer in front of a model with a larger vocabulary (bench/run_ray_serve_gpu.sh: the router's
byte tokenizer, Llama-3.1-8B-shape dummy weights generating ids across 128256): ids the byte vocabulary
cannot render carry no text, exactly like its own BOS/EOS/PAD; nothing raises and bytes around them
still decode, also when a multi-byte character is split by such ids."""

from __future__ import annotations

from zipkv.controlplane.tokenizer import ByteTokenizer, IncrementalDetokenizer

LLAMA_IDS = [128000, 256, 70000, 128255, 259, 300]  # none is a byte: no text


def test_ids_beyond_the_byte_vocab_decode_to_nothing() -> None:
    tok = ByteTokenizer()
    assert tok.decode([*LLAMA_IDS, *b"ok", 128009]) == "ok"


def test_streaming_detokenizer_skips_them_without_losing_split_characters() -> None:
    detok = IncrementalDetokenizer(ByteTokenizer())
    euro = "€".encode()  # 3 bytes
    pieces = [detok.push([128000, *b"A"]), detok.push([euro[0], 99999]), detok.push([euro[1], 128256])]
    pieces += [detok.push([euro[2], 70000]), detok.push([128009]), detok.flush()]
    assert "".join(pieces) == "A€"
    assert "\ufffd" not in "".join(pieces)
