"""The engine factory: the engine a worker's settings select, loaded and ready to step."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from zipkv.worker.checkpoint import ModelShape, check_kv_budget, model_shape, resolve_context
from zipkv.worker.engine import Engine
from zipkv.worker.settings import WorkerSettings, resolve_device


def build_engine(settings: WorkerSettings) -> Engine:
    """The configured engine, loaded and ready to step."""
    if settings.engine == "sglang":
        from zipkv.worker.engines.sglang.availability import build_sglang_engine

        return build_sglang_engine(settings)
    import torch

    from zipkv.worker.engines.reference.engine import ReferenceEngine, ReferenceEngineConfig
    from zipkv.worker.engines.reference.gguf_import import resolve_model_path
    from zipkv.worker.engines.reference.model import load_model

    torch.set_num_threads(settings.torch_threads)
    device = resolve_device(settings.device)
    path = resolve_model_path(settings.model_path) if settings.model_path else None  # a GGUF: dequantized
    name = settings.model_name
    if path != settings.model_path and not name:  # named after the GGUF, not its cache folder
        name = os.path.splitext(os.path.basename(os.path.normpath(str(settings.model_path))))[0]
    loaded = load_model(path, device, name)
    config = ReferenceEngineConfig(
        kv_budget_bytes=settings.kv_budget_bytes,
        compression=settings.compression,
        max_running_requests=settings.max_running_requests,
    )
    model_config: Any = loaded.model.config
    shape = model_shape(model_config.to_dict())
    context = checked_context(
        shape, settings.max_context_tokens, config.kv_budget_bytes, config.compression, config.chunk_bytes,
        config.format_version,
    )  # fmt: skip
    return ReferenceEngine(dataclasses.replace(loaded, max_context_tokens=context), config, device)


def checked_context(
    shape: ModelShape,
    asked_tokens: int,
    budget_bytes: int,
    compression: bool,
    chunk_bytes: int = 256 << 10,
    format_version: int | None = None,
) -> int:
    """The context a reference-engine worker serves (the model's, or ``asked_tokens`` within it), checked
    at start-up against what an idle KV budget holds; raises ValueError saying what to change."""
    from zipkv.kernels.format.layout import FORMAT_VERSION, PageFormat
    from zipkv.worker.engines.reference.kvstore import idle_capacity_tokens

    context = resolve_context(shape, asked_tokens or None)
    version = FORMAT_VERSION if format_version is None else format_version
    fmt = PageFormat(head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads, version=version)
    check_kv_budget(
        context,
        budget_bytes,
        shape,
        lambda b: idle_capacity_tokens(fmt, shape.num_layers, b, compression, chunk_bytes),
    )
    return context
