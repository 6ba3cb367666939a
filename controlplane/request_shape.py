"""What a parsed request asks for, in the router's types: the served model, the prompt's token ids
(tokenising), its `RequestShape` (placement, after the context check) and `Sampling` (dispatch). Every
malformed case is a 400 in the OpenAI error shape.

Split from router.py, which runs a request through the gate (gate.py), dispatch and the response: these are
pure functions of the request, the config and the tokenizer.
"""

from __future__ import annotations

from zipkv.controlplane import gate
from zipkv.controlplane.chat_template import NoChatTemplate
from zipkv.controlplane.config import ModelConfig, RouterConfig
from zipkv.controlplane.context import fits_context
from zipkv.controlplane.dispatch_request import Sampling
from zipkv.controlplane.openai_api import ChatRequest, CompletionRequest
from zipkv.controlplane.placement import RequestShape
from zipkv.controlplane.tokenizer import Tokenizer


def find_model(cfg: RouterConfig, name: str) -> ModelConfig:
    """The served model of that name; 400 naming the served ones otherwise."""
    model = cfg.model(name)
    if model is None:
        served = [m.name for m in cfg.models]
        raise gate.bad_request(
            f"unknown model {name!r}; this router serves {served}", "model", "model_not_found"
        )
    return model


def prompt_ids(cfg: RouterConfig, req: ChatRequest | CompletionRequest, tok: Tokenizer) -> list[int]:
    """The prompt's token ids: a chat through the model's template, text encoded, ids checked."""
    if isinstance(req, ChatRequest):
        limit = cfg.http.max_prompt_messages
        if len(req.messages) > limit:
            raise gate.bad_request(f"messages: {len(req.messages)} messages, at most {limit}", "messages")
        msgs = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            return tok.chat_ids(msgs)
        except NoChatTemplate as exc:
            raise gate.bad_request(
                f"model {req.model!r}: {exc}", "messages", "chat_template_missing"
            ) from None
        except Exception as exc:  # a template that refuses the conversation (jinja raise_exception)
            raise gate.bad_request(f"messages: the chat template refused them: {exc}", "messages") from None
    if isinstance(req.prompt, str):
        return tok.encode(req.prompt)
    if isinstance(req.prompt[0], str):
        return tok.encode(str(req.prompt[0]))
    ids = [int(i) for i in req.prompt]
    if any(i < 0 or i >= tok.vocab_size for i in ids):
        raise gate.bad_request(f"prompt: token ids must be in [0, {tok.vocab_size})", "prompt")
    return ids


def request_shape(
    req: ChatRequest | CompletionRequest,
    model: ModelConfig,
    n_prompt: int,
    slo: tuple[float, float],
    ctx: int,
) -> RequestShape:
    """What placement needs; 400 when the prompt, or the prompt and max_tokens, exceed the context ``ctx``."""
    if not fits_context(n_prompt + 1, ctx):  # room for at least one new token
        raise gate.bad_request(
            f"prompt has {n_prompt} tokens; model {model.name!r} accepts at most {ctx - 1} "
            f"(its context is {ctx}); shorten the prompt",
            "prompt",
            "context_length_exceeded",
        )
    asked = req.requested_max_tokens() if isinstance(req, ChatRequest) else req.max_tokens
    if asked is not None and not fits_context(n_prompt + asked, ctx):
        raise gate.bad_request(
            f"prompt ({n_prompt}) + max_tokens ({asked}) exceeds the context of {ctx} tokens; "
            "lower max_tokens",
            "max_tokens",
            "context_length_exceeded",
        )
    max_new = asked if asked is not None else min(model.default_max_tokens, ctx - n_prompt)
    return RequestShape(model.name, n_prompt, max_new, slo[0], slo[1], model.prefill_ms_per_token)


def sampling(req: ChatRequest | CompletionRequest, tok: Tokenizer) -> Sampling:
    """How to sample; stops at the tokenizer's stop tokens (EOS and generation_config.json's) unless told
    to ignore EOS."""
    stops = [] if req.ignore_eos else list(tok.stop_token_ids)
    return Sampling(req.temperature, req.top_p, req.top_k, tuple(stops), req.ignore_eos, req.seed)
