"""What a model folder says about serving it, read before any weights load: its context length and KV
shape (config.json), and whether a KV budget holds one request of that context.

Context: `max_position_embeddings`, capped at an active sliding window. The reference engine attends over
every cached token; within the window that is what a sliding-window model computes, beyond it it is not,
so the window bounds the context (a longer `max_context_tokens` is refused).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zipkv.kernels.format.layout import PAGE_TOKENS

MiB = 1 << 20


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model's config that serving needs (no weights)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    context_tokens: int  # max_position_embeddings, capped at an active sliding window
    max_position_tokens: int  # max_position_embeddings as the config gives it
    sliding_window_tokens: int | None  # None: every layer attends to the whole context

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * 2 * self.num_layers  # K and V, bf16, every layer


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"model path {folder} has no config.json: give a local Hugging Face checkpoint folder, a GGUF "
            "file (or a folder holding one), or no path for the built-in tiny model"
        )
    config = json.loads(path.read_text())
    return dict(config.get("text_config") or config)  # multimodal configs nest the language model's


def sliding_window_tokens(config: dict[str, Any]) -> int | None:
    """The attention window the config turns on, or None (Mistral: `sliding_window`; Qwen2/3: also
    `use_sliding_window`; transformers 5: `layer_types` with a `sliding_attention` layer)."""
    window = config.get("sliding_window")
    if not window or config.get("use_sliding_window") is False:
        return None
    layer_types = config.get("layer_types")
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def model_shape(config: dict[str, Any]) -> ModelShape:
    heads = int(config["num_attention_heads"])
    max_pos = int(config.get("max_position_embeddings") or 0)
    if max_pos <= 0:
        raise ValueError("config.json has no max_position_embeddings: set max_context_tokens explicitly")
    window = sliding_window_tokens(config)
    return ModelShape(
        num_layers=int(config["num_hidden_layers"]),
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        context_tokens=min(max_pos, window) if window else max_pos,
        max_position_tokens=max_pos,
        sliding_window_tokens=window,
    )


def resolve_context(shape: ModelShape, asked_tokens: int | None) -> int:
    """The context to serve: the model's, or ``asked_tokens`` when given and within it."""
    if not asked_tokens:
        return shape.context_tokens
    if asked_tokens < 2:
        raise ValueError(f"max_context_tokens must be >= 2, got {asked_tokens}")
    if asked_tokens > shape.context_tokens:
        why = (
            f"its sliding window of {shape.sliding_window_tokens} tokens (attention beyond the window is "
            "not implemented by the reference engine)"
            if shape.sliding_window_tokens and shape.sliding_window_tokens < shape.max_position_tokens
            else f"its max_position_embeddings ({shape.max_position_tokens})"
        )
        raise ValueError(
            f"max_context_tokens {asked_tokens} exceeds the model's context of {shape.context_tokens} "
            f"tokens, set by {why}: ask for {shape.context_tokens} or less"
        )
    return asked_tokens


def check_kv_budget(
    context_tokens: int, budget_bytes: int, shape: ModelShape, idle_tokens_for: Callable[[int], int]
) -> None:
    """Refuse to start when one request of the whole context does not fit an idle worker's KV budget (it
    would be refused every time). ``idle_tokens_for(budget_bytes)``: new tokens an idle engine admits."""
    needed_tokens = math.ceil(context_tokens / PAGE_TOKENS) * PAGE_TOKENS
    idle_tokens = idle_tokens_for(budget_bytes)
    if needed_tokens <= idle_tokens:
        return
    lo, hi = math.ceil(budget_bytes / MiB), 2 * math.ceil(budget_bytes / MiB)
    while idle_tokens_for(hi * MiB) < needed_tokens:  # the smallest whole MiB that fits, to suggest
        lo, hi = hi, 2 * hi
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if idle_tokens_for(mid * MiB) < needed_tokens else (lo, mid)
    raise ValueError(
        f"the KV budget of {budget_bytes / MiB:g} MiB holds {idle_tokens} tokens "
        f"({shape.kv_bytes_per_token} B of KV per token over {shape.num_layers} layers), fewer than one "
        f"request at the context of {context_tokens} tokens: raise the budget to at least {hi} MiB "
        "(zipkv up --kv-budget-mib, worker kv_budget_mib) or lower the context (zipkv up "
        "--max-context-tokens, worker max_context_tokens)"
    )
