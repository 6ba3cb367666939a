"""What zipkv hands SGLang: the ``sglang.Engine`` arguments, sized from the worker's settings and the model's
config.json, and each request's sampling parameters (no sglang import here; CPU-tested).

Split from engine.py, which runs the engine: these are pure functions of the settings, the model folder and
a request, and docs/sglang.md explains each argument.
"""

from __future__ import annotations

import json
import os
from typing import Any

from zipkv.worker.engine import SamplingOptions
from zipkv.worker.engines.sglang.telemetry import tracing_kwargs
from zipkv.worker.settings import WorkerSettings

CHUNKED_PREFILL_TOKENS = 8192  # the serving benchmark's chunk (SGLang's own default depends on GPU memory)


def engine_kwargs(settings: WorkerSettings, model_path: str, **overrides: Any) -> dict[str, Any]:
    """The ``sglang.Engine`` arguments for zipkv; `settings.sglang_args` win over these, overrides over
    both (see docs/sglang.md for each)."""
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "attention_backend": "zipkv" if settings.compression else "zipkv_uncompressed",
        "page_size": 16,
        "dtype": "bfloat16",
        "max_running_requests": settings.max_running_requests,
        "max_total_tokens": settings.kv_budget_bytes // kv_bytes_per_token(model_path),
        **({"context_length": settings.max_context_tokens} if settings.max_context_tokens else {}),
        "disable_prefill_cuda_graph": True,  # zipkv's extend runs eagerly (milestone 2 covers decode graphs)
        # SGLang's radix cache and chunked prefill, as the serving benchmark runs them
        # (bench/run_serving_gpu.sh): greedy tokens identical to compression off with cached prefixes and
        # under eviction pressure, no failed allocation or retraction with 793k prompt tokens against a 389k
        # budget (docs/benchmarks.md, "The radix cache under memory pressure"); sglang_args turn either off.
        "disable_radix_cache": False,
        "chunked_prefill_size": CHUNKED_PREFILL_TOKENS,
        "sampling_backend": "pytorch",
        "skip_tokenizer_init": True,  # the router tokenizes; the worker sees token ids
        "log_level": "warning",
        "random_seed": 0,
        # A replica given several GPUs runs SGLang over all of them (settings.py checks sglang_args agree).
        **({"tp_size": settings.tensor_parallel_size()} if settings.tensor_parallel_size() > 1 else {}),
        **tracing_kwargs(),  # SGLang's scheduler spans join the worker's trace (telemetry.py)
    }
    kwargs.update(settings.sglang_kwargs())
    kwargs.update(overrides)
    return kwargs


def model_config(model_path: str) -> dict[str, Any]:
    """The model folder's config.json."""
    with open(os.path.join(model_path, "config.json")) as f:
        return dict(json.load(f))


def kv_bytes_per_token(model_path: str) -> int:
    """Uncompressed bf16 KV bytes per token over all layers, from the model's config.json."""
    cfg = model_config(model_path)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg.get("num_key_value_heads", heads) * head_dim * 2 * cfg["num_hidden_layers"]


def sglang_sampling_params(s: SamplingOptions) -> dict[str, Any]:
    """SGLang's `sampling_params` for one request. A seed goes in as `sampling_seed`; SGLang samples
    from it only with `enable_deterministic_inference` (pass it in `sglang_args`), else it is ignored."""
    return {
        "max_new_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k or -1,
        "ignore_eos": s.ignore_eos,
        "stop_token_ids": list(s.stop_token_ids) or None,
        "sampling_seed": s.seed or None,  # 0: no seed
    }
