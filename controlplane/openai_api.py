"""OpenAI-compatible request models (the HTTP edge, pydantic) and response bodies."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


INT32_MAX = (1 << 31) - 1
# Seeds go to the worker as seed + 1 (0 on the wire means "none"); SGLang keeps them as int64.
SEED_MAX = (1 << 63) - 2

# OpenAI fields this server does not implement, each with the values that mean "not used". A request
# that sets one to anything else gets 400 naming it, instead of an answer that silently ignored it.
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "min_p": (None, 0),
    "audio": (None,),
    "prediction": (None,),
    "modalities": (None, ["text"]),
}


def _same(value: object, unused: object) -> bool:
    if isinstance(value, bool) or isinstance(unused, bool):  # True == 1: `logprobs: true` is not 1
        return type(value) is type(unused) and value == unused
    return value == unused


def unsupported_field(data: dict[str, Any]) -> str | None:
    """The first OpenAI field `data` sets that this server does not implement (None when none)."""
    for name, unused in UNSUPPORTED.items():
        if name in data and not any(_same(data[name], u) for u in unused):
            return name
    return None


class _Sampling(BaseModel):
    # Unknown fields are ignored (clients send many optional ones); known-unsupported ones are refused
    # (UNSUPPORTED, checked before this model). NaN and infinity are not numbers a sampler can use. Strict
    # types: JSON's true is not the integer 1 nor 0.0 the boolean false (a seed of `true`, a prompt of
    # booleans or `"stream": 0.0` are refused, as the schema says, instead of being read as something else).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=INT32_MAX, description="0 or -1: off")
    n: int = Field(default=1, ge=1, le=1, description="only n=1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    ignore_eos: bool = False
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else v or []
        if len(items) > 4 or any(not s for s in items):
            raise ValueError("stop: at most 4 non-empty strings")
        return v

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str | list[int] | list[str]) -> str | list[int] | list[str]:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt is empty")
            if isinstance(v[0], str) and len(v) != 1:
                raise ValueError("batched prompts are not supported: send one prompt per request")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def error_body(message: str, type_: str, code: int | str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ResponseShape:
    """Builds the bodies of one response (chat or text completion), streaming or not."""

    def __init__(self, kind: Literal["chat", "text"], model: str, request_id: str) -> None:
        self.kind, self.model = kind, model
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{request_id}"
        self.created = int(time.time())
        self._role_sent = False
        self._delta_frame: tuple[bytes, bytes] | None = None  # delta_json's bytes before and after the text

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        if self.kind == "text":
            body = self._base("text_completion")
            body["choices"] = [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}]
            return body
        delta: dict[str, Any] = {"content": text} if text or finish_reason is None else {}
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        body = self._base("chat.completion.chunk")
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
        return body

    def delta_json(self, text: str) -> bytes:
        """`chunk(text, None)` as compact JSON bytes. Every delta chunk after the first differs only in its
        text, so its bytes around the text are built once, from `chunk` itself, and each token encodes only
        its text: the same bytes as json.dumps of the whole body (ensure_ascii), without a dict per token."""
        if self.kind == "chat" and not self._role_sent:
            return _compact(self.chunk(text, None))  # the first chat chunk also carries the role
        if self._delta_frame is None:
            marker = f"<text {uuid.uuid4().hex}>"
            head, tail = _compact(self.chunk(marker, None)).split(json.dumps(marker).encode())
            self._delta_frame = (head, tail)
        head, tail = self._delta_frame
        return head + json.dumps(text).encode() + tail

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        body = self._base("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = usage_body(prompt_tokens, completion_tokens)
        return body

    def full(
        self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        if self.kind == "text":
            body = self._base("text_completion")
            body["choices"] = [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}]
        else:
            body = self._base("chat.completion")
            message = {"role": "assistant", "content": text}
            body["choices"] = [
                {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
            ]
        body["usage"] = usage_body(prompt_tokens, completion_tokens)
        return body
