"""The producer kernel (kernels/attention/hopper/specialized.py) the way the SGLang worker drives it, without
SGLang: page tables as rows of ``max_pages`` ids (stale ids past each request's end), requests padded to a
CUDA-graph batch with one-token rows, the plan built and the kernel launched inside a captured CUDA graph and
replayed on new lengths. Each step prints a line as it completes, so under ``timeout`` the last line says
where a hang is.

    python -m bench.kernels.producer_serving_repro [--mode 1] [--batch 8] [--ctx 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from bench.kernels.decode_attention_baselines import rel_err
from bench.kernels.hopper_cases import make_case
from zipkv.kernels.attention.decode_plan import plan_decode
from zipkv.kernels.attention.hopper.launch import decode_attention_hopper
from zipkv.kernels.reference.attention import decode_attention_reference


def _say(step: str, **fields: object) -> None:
    print("repro", json.dumps({"step": step, "t": round(time.monotonic(), 2), **fields}), flush=True)


def _rows(case: dict, max_pages: int) -> torch.Tensor:  # type: ignore[type-arg]
    """int32 [B, max_pages]: each request's page ids, then stale ids of others (as req_to_token holds)."""
    ids, indptr = case["page_ids"], case["indptr"].tolist()
    n = ids.numel()
    rows = torch.randint(0, n, (len(indptr) - 1, max_pages), dtype=torch.int32, device="cuda")
    for b in range(len(indptr) - 1):
        rows[b, : indptr[b + 1] - indptr[b]] = ids[indptr[b] : indptr[b + 1]]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2000)
    a = ap.parse_args()
    lens = [a.ctx + 37 * b for b in range(a.batch - 1)] + [1]  # the last row: a graph's padding request
    case = make_case(lens, 8, 128, 4, seed=3, raw_mid=0.0, shuffle=True, outliers=20)
    max_pages = -(-max(lens) // 16) + 3
    rows = _rows(case, max_pages)
    indptr = torch.arange(a.batch + 1, dtype=torch.int32, device="cuda") * max_pages
    kv_lens = case["lens"].clone()
    q = torch.randn(a.batch, 32, 128, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(128)

    def step() -> None:
        plan = plan_decode(rows.reshape(-1), indptr, kv_lens, case["fmt"], 32, block_n=64, num_warps=4)
        decode_attention_hopper(
            plan, q, case["heap"], case["loc"], case["meta"], scale, out=out, producer=a.mode
        )

    ref = decode_attention_reference(q, case["pages"], case["page_ids"], case["indptr"], case["lens"], scale)
    step()
    torch.cuda.synchronize()
    _say("eager", rel_err=rel_err(out, ref))
    kv_lens.fill_(1)  # as SGLang's capture: every row one token
    step()
    torch.cuda.synchronize()
    _say("eager, one token a row")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    _say("captured")
    kv_lens.copy_(case["lens"])
    graph.replay()
    torch.cuda.synchronize()
    _say("replayed", rel_err=rel_err(out, ref))


if __name__ == "__main__":
    main()
