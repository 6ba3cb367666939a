"""Tokenisers the router uses (token ids cross the wire; the router tokenises). No torch here.

`ByteTokenizer` is the built-in byte-level tokenizer of the worker's embedded tiny model:

    ids 0..255  the bytes of the UTF-8 text
    256         BOS (`bos_token_id`), prepended to every prompt
    257         EOS (`eos_token_id`), the stop token
    258         PAD (`pad_token_id`)
    vocab_size  259

Its chat template renders each message as `<role>: <content>\n` and ends with `assistant: ` when a
generation prompt is wanted. The worker imports this class; keep it dependency-free.

`HFTokenizer` loads `tokenizer.json` (the `tokenizers` package) of a local model folder, its chat
template from wherever transformers keeps it (chat_template.py: compiled once, rendered as transformers
renders it) and its stop tokens: the tokenizer's EOS and `eos_token_id` of generation_config.json.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from zipkv.controlplane.chat_template import (
    ChatTemplate,
    NoChatTemplate,
    find_chat_templates,
    select_chat_template,
)

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> int | None: ...
    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...
    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]: ...


class ByteTokenizer:
    """Bytes as tokens, plus BOS/EOS/PAD. Deterministic, no files, matches the worker's tiny model."""

    vocab_size = 259
    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    stop_token_ids = (257,)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        # Special ids carry no text; a split multi-byte character decodes to U+FFFD until complete.
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + "assistant: " if add_generation_prompt else text

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.encode(self.apply_chat_template(messages))


class HFTokenizer:
    """A local `tokenizer.json`, its chat template and stop tokens; torch-free.

    ``chat_template``: "" for the folder's default template, a template name, or a .jinja file.
    """

    def __init__(self, folder: str | Path, chat_template: str = "") -> None:
        from tokenizers import Tokenizer as _Tok

        path = Path(folder)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(
                f"tokenizer: {file} not found; point the model's `tokenizer` at a folder with tokenizer.json"
            )
        self.folder = file.parent
        self._tok = _Tok.from_file(str(file))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        cfg = {
            **_read_json(self.folder / "special_tokens_map.json"),
            **_read_json(self.folder / "tokenizer_config.json"),
        }
        special = {k: text for k in SPECIAL_TOKEN_KEYS if (text := _token_text(cfg.get(k))) is not None}
        self.bos_token, self.eos_token = special.get("bos_token"), special.get("eos_token")
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.stop_token_ids = _stop_ids(self.eos_token_id, _read_json(self.folder / "generation_config.json"))
        source = select_chat_template(find_chat_templates(self.folder, cfg), chat_template, str(self.folder))
        self.chat_template = ChatTemplate(source, special) if source is not None else None

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_bos).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        if self.chat_template is None:
            raise NoChatTemplate(
                f"this model has no chat template ({self.folder} has no chat_template.jinja and its "
                "tokenizer_config.json no chat_template): add one there, or set the model's chat_template "
                "in the router config to a .jinja file (zipkv up --chat-template FILE), or send a prompt "
                "to /v1/completions instead"
            )
        return self.chat_template.render(messages, add_generation_prompt)

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        # The template places BOS and the other special tokens where the model wants them.
        return self.encode(self.apply_chat_template(messages), add_bos=False)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _stop_ids(eos_token_id: int | None, generation_config: dict[str, Any]) -> tuple[int, ...]:
    """The tokenizer's EOS, then generation_config.json's `eos_token_id` (an id or a list), once each."""
    eos = generation_config.get("eos_token_id")
    listed = eos if isinstance(eos, list) else [] if eos is None else [eos]
    ids = [] if eos_token_id is None else [eos_token_id]
    return tuple(dict.fromkeys([*ids, *(int(i) for i in listed)]))


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def load_tokenizer(spec: str, chat_template: str = "") -> Tokenizer:
    """`byte` -> ByteTokenizer (its built-in chat format); else a folder (or file) holding tokenizer.json,
    with ``chat_template`` choosing among its templates (or a .jinja file)."""
    if spec == "byte":
        if chat_template:
            raise ValueError(
                "chat_template: the byte tokenizer has its own built-in chat format; leave it empty"
            )
        return ByteTokenizer()
    return HFTokenizer(spec, chat_template)


class IncrementalDetokenizer:
    """Turns a growing id list into text deltas without re-decoding everything and without emitting
    half a character (a delta is held back while the decoded tail is U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            delta = text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is held back at the end (a truncated character decodes as U+FFFD)."""
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text) :]
