"""Compile FlashInfer's prefill modules for the zipkv worker's model shape before SGLang asks for them.

On a fresh GPU machine FlashInfer JIT-compiles its prefill kernels at the first extend, which SGLang 0.5.17
reports only once that batch is done ("Prefill batch" is logged when its result is processed): two minutes
and more of a silent server, long enough to outlive a run's timeout. run_sglang_e2e_gpu.sh starts this in the
background at the start of a call, so the compile overlaps the server's own start; FlashInfer builds under a
file lock, so the worker's first extend waits for this build instead of starting its own. It plans and runs
the worker's own wrappers (worker/engines/sglang/flashinfer_prefill.py), with and without a cached prefix, so
it builds exactly the modules the worker loads.

    python -m bench.serving.warm_prefill --model .carry/llama31_8b
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from zipkv.worker.checkpoint import model_shape, read_config
from zipkv.worker.engines.sglang.flashinfer_prefill import PAGE_TOKENS, FlashInferPrefill, PrefixPages


def model_heads(model_dir: Path) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) from a Hugging Face config.json, read as the worker reads it."""
    cfg = read_config(model_dir)
    shape = model_shape(cfg)
    return int(cfg["num_attention_heads"]), shape.num_kv_heads, shape.head_dim


def warm(q_heads: int, kv_heads: int, head_dim: int, device: torch.device) -> dict[str, float]:
    """Seconds each path took (its compile, on a cold machine): two requests of 16 new tokens, then the same
    over one cached page each."""
    prefill = FlashInferPrefill(q_heads, kv_heads, head_dim, device)
    qo_indptr = torch.tensor([0, 16, 32], dtype=torch.int32, device=device)
    q = torch.randn(32, q_heads, head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(32, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    pages = torch.randn(2, 2, kv_heads, PAGE_TOKENS, head_dim, device=device, dtype=torch.bfloat16)
    seconds: dict[str, float] = {}
    for name, prefix in (("ragged", None), ("paged", PrefixPages([1, 1], [PAGE_TOKENS, 5]))):
        t0 = time.monotonic()
        prefill.plan(qo_indptr, prefix)
        out = prefill.run(q, k, k, head_dim**-0.5, pages if prefix is not None else None)
        torch.cuda.synchronize(device)
        if not bool(torch.isfinite(out.float()).all()):
            raise RuntimeError(f"FlashInfer's {name} prefill gave non-finite values on random inputs")
        seconds[name] = round(time.monotonic() - t0, 1)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="a directory holding config.json")
    a = ap.parse_args()
    q_heads, kv_heads, head_dim = model_heads(a.model)
    t0 = time.monotonic()
    seconds = warm(q_heads, kv_heads, head_dim, torch.device("cuda"))
    total_s = round(time.monotonic() - t0, 1)
    shape = {"q_heads": q_heads, "kv_heads": kv_heads, "head_dim": head_dim}
    print(json.dumps({"event": "prefill_warm", **shape, "seconds": seconds, "total_s": total_s}))


if __name__ == "__main__":
    main()
