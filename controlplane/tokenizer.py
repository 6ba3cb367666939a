"""Tokenisers the router uses (token ids cross the wire; the router tokenises). No torch here.

`ByteTokenizer` is the built-in byte-level tokenizer of the worker's embedded tiny model:

    ids 0..255  the bytes of the UTF-8 text
    256         BOS (`bos_token_id`), prepended to every prompt
    257         EOS (`eos_token_id`), the stop token
    258         PAD (`pad_token_id`)
    vocab_size  259

Its chat template renders each message as `<role>: <content>\n` and ends with `assistant: ` when a
generation prompt is wanted. The worker imports this class; keep it dependency-free.

`HFTokenizer` loads `tokenizer.json` (the `tokenizers` package) and the chat template from
`tokenizer_config.json` of a local model folder, rendered with jinja2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> int | None: ...

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
    """A local `tokenizer.json` (+ optional `tokenizer_config.json` chat template); torch-free."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer as _Tok

        path = Path(folder)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(
                f"tokenizer: {file} not found; point the model's `tokenizer` at a folder with tokenizer.json"
            )
        self._tok = _Tok.from_file(str(file))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        cfg_file = file.parent / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        self._template: str | None = (
            cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None
        )
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_bos).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        if self._template is None:
            return ByteTokenizer().apply_chat_template(messages, add_generation_prompt)
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
        )

        def _raise(msg: str) -> None:
            raise ValueError(msg)

        env.globals["raise_exception"] = _raise
        return env.from_string(self._template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        # The template already places BOS where the model wants it.
        add_bos = self._template is None
        return self.encode(self.apply_chat_template(messages), add_bos=add_bos)


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def load_tokenizer(spec: str) -> Tokenizer:
    """`byte` -> ByteTokenizer; else a folder (or file) holding tokenizer.json."""
    if spec == "byte":
        return ByteTokenizer()
    return HFTokenizer(spec)


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
