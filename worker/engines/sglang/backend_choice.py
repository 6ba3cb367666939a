"""Which zipkv backend SGLang's server arguments select, checked against what zipkv's pool supports.

Read from SGLang's ``ServerArgs`` (duck-typed: no sglang import) when its KV pool is built (seams.py): a
combination zipkv cannot serve fails there, at start-up, with what to change.
"""

from __future__ import annotations

from typing import Any

BACKEND_NAMES = {"zipkv": True, "zipkv_uncompressed": False}  # name -> compression


def is_zipkv(backend: str | None) -> bool:
    return backend in BACKEND_NAMES


def zipkv_backend(server_args: Any) -> str | None:
    """The zipkv backend name if one is selected, after checking that prefill and decode agree."""
    prefill, decode = server_args.get_attention_backends()
    if not (is_zipkv(prefill) or is_zipkv(decode)):
        return None
    if prefill != decode:
        raise ValueError(
            f"zipkv serves prefill and decode over one compressed pool: set attention_backend="
            f"{decode if is_zipkv(decode) else prefill!r} for both (got {prefill!r}, {decode!r})"
        )
    if server_args.page_size != 16:
        raise ValueError(
            f"zipkv pages hold 16 tokens: start SGLang with page_size=16 (got {server_args.page_size})"
        )
    if server_args.tp_size < 1 or server_args.enable_dp_attention or server_args.pp_size != 1:
        raise ValueError(
            "zipkv on SGLang runs with tensor parallelism only (tp_size >= 1, no DP attention, pp_size=1); "
            f"got tp_size={server_args.tp_size}, enable_dp_attention={server_args.enable_dp_attention}, "
            f"pp_size={server_args.pp_size}"
        )
    if server_args.kv_cache_dtype not in (None, "auto", "bfloat16", "bf16"):
        raise ValueError(f"zipkv stores bf16 KV: drop kv_cache_dtype={server_args.kv_cache_dtype!r}")
    return str(prefill)
