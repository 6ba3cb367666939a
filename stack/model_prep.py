"""The model a local stack serves: its name, a GGUF file turned into a Hugging Face folder (once, cached),
and the context that every router config and replica carries, checked against the KV budget.

Split from local_stack.py: resolving the model happens once, before any process starts, and reads only
the stack's options.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

TINY_MODEL_NAME = "zipkv-tiny"  # the built-in tiny model, when no model path is given


def served_name(model_name: str | None, model_path: str | None) -> str:
    """The name clients ask for: the option, else the model file's stem or folder's name."""
    if model_name:
        return model_name
    if not model_path:
        return TINY_MODEL_NAME
    path = Path(model_path)
    return path.stem if path.suffix == ".gguf" else path.name


def prepare_model(
    model_path: str | None,
    max_context_tokens: int | None,
    kv_budget_mib: float,
    compression: bool,
    say: Callable[[str], None],
) -> tuple[str | None, int]:
    """(the model folder to serve, its context in tokens). Raises ValueError saying what to change when
    the context does not fit the KV budget."""
    from zipkv.worker.checkpoint import model_shape, read_config
    from zipkv.worker.engine_factory import checked_context
    from zipkv.worker.engines.reference.gguf_import import resolve_model_path
    from zipkv.worker.engines.reference.model import tiny_config

    if model_path:
        model_path = resolve_model_path(model_path, progress=say)
        shape = model_shape(read_config(model_path))
    else:
        shape = model_shape(tiny_config().to_dict())
    budget = int(kv_budget_mib * (1 << 20))
    context_tokens = checked_context(shape, max_context_tokens or 0, budget, compression)
    say(f"context {context_tokens} tokens (model {shape.context_tokens})")
    return model_path, context_tokens
