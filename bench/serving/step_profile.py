"""Where a decode step's GPU time goes: a torch-profiler trace of a few decode steps at the largest batch,
taken by SGLang's own profiler, summarised per kernel.

The timed run's metrics stay untouched: the profile is a second pass of the same requests after the timed
one (``profile_decode_steps``). Once the first request has ``after_tokens`` tokens every prefill is done
(chunked prefill is off, so SGLang prefills until the pool is full before it decodes) and the batch is at its
largest; SGLang's profiler then records ``steps`` forward passes, GPU activity only, and writes a Chrome
trace. CUDA-graph replays appear kernel by kernel (CUPTI reports the kernels of a graph launch).

``summarize_trace`` turns the trace into milliseconds per step: every kernel by name, grouped into
``KERNEL_GROUPS`` (attention, merge, GEMM, ...), the sum of kernel time and the wall span from the first
kernel's start to the last one's end. Kernel time below the span is time the GPU sat idle between kernels.
Steps are counted as attention launches / layers (one launch per layer and step): the trace may start and
end inside a step, and those partial steps then count by the share of their layers that it holds.

    python -m bench.serving.step_profile TRACE.json.gz --layers 32     (a saved trace's summary)
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (group, pattern over the kernel name): the first match names a kernel's group.
# Norms come before FlashInfer's attention: FlashInfer names its norm kernels flashinfer::norm::..., which a
# bare "flashinfer" pattern took for attention and counted as launches (3x the steps on the H100 profile).
KERNEL_GROUPS: tuple[tuple[str, str], ...] = (
    ("attention_zipkv", r"(^|\W)_decode(_hopper|_twin)?_kernel"),  # not SGLang's alloc_decode_kernel
    ("attention_merge", r"_merge_kernel|MergeStates"),
    ("norm_rope_act", r"rms|norm|rotary|rope|silu|act_and_mul|gelu"),
    ("attention_flashinfer", r"BatchDecode|BatchPrefill|flashinfer::"),  # not create_flashinfer_kv_indices
    ("kv_store", r"store_kv|set_kv|_store_tokens|_append|scatter|index_put|_encode"),
    ("gemm", r"gemm|nvjet|sm90_xmma|cutlass|cublas|Kernel2"),
    ("sampling", r"argmax|softmax|sample|topk"),
)


def kernel_group(name: str) -> str:
    for group, pattern in KERNEL_GROUPS:
        if re.search(pattern, name, re.IGNORECASE):
            return group
    return "other"


def kernel_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's GPU kernels (Chrome trace events of category ``kernel``), in start order."""
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]
    return sorted(events, key=lambda e: float(e["ts"]))


ATTENTION_GROUPS = ("attention_zipkv", "attention_flashinfer")


def summarize_trace(trace: dict[str, Any], layers: int, top: int = 20) -> dict[str, Any]:
    """Per-step milliseconds of the kernels in ``trace`` of a model with ``layers`` attention layers."""
    if layers <= 0:
        raise ValueError(f"layers must be positive, got {layers}")
    events = kernel_events(trace)
    launches = sum(1 for e in events if kernel_group(e["name"]) in ATTENTION_GROUPS)
    if not launches:
        return {"error": f"no attention kernels among the trace's {len(events)} kernel events"}
    steps = launches / layers
    by_name: dict[str, float] = {}
    by_group: dict[str, float] = {}
    for e in events:
        us = float(e["dur"])
        by_name[e["name"]] = by_name.get(e["name"], 0.0) + us
        group = kernel_group(e["name"])
        by_group[group] = by_group.get(group, 0.0) + us
    span_us = float(events[-1]["ts"]) + float(events[-1]["dur"]) - float(events[0]["ts"])
    per_step = 1e-3 / steps
    names = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "steps": round(steps, 2),
        "attention_launches": launches,
        "kernels_per_step": round(len(events) / steps, 1),
        "kernel_ms_per_step": round(sum(by_name.values()) * per_step, 3),
        "span_ms_per_step": round(span_us * per_step, 3),
        "groups_ms_per_step": {
            g: round(us * per_step, 3) for g, us in sorted(by_group.items(), key=lambda kv: -kv[1])
        },
        "top_kernels_ms_per_step": [
            {"name": n[:160], "group": kernel_group(n), "ms": round(us * per_step, 3)} for n, us in names
        ],
    }


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return dict(json.load(f))


async def profile_decode_steps(
    eng: Any,  # sglang.Engine (or zipkv's subclass), its loop running this coroutine
    prompts: Sequence[Sequence[int]],
    sampling: dict[str, Any],
    out_dir: Path,
    steps: int,
    layers: int,
    after_tokens: int = 40,
) -> dict[str, Any]:
    """Resubmit ``prompts``; once the first request has ``after_tokens`` tokens (at most half its
    ``max_new_tokens``), profile ``steps`` forward passes. Returns the summary of the trace SGLang wrote
    (and where it is) or what went wrong. The profile starts only if the requests are still decoding: a
    workload of 32 output tokens against the fixed 40 once left the trigger waiting after every request had
    finished, and the pass hung until its process was killed (H100, 2026-12-06)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    started = asyncio.Event()
    after_tokens = min(after_tokens, max(1, int(sampling.get("max_new_tokens", after_tokens)) // 2))

    async def one(i: int) -> None:
        stream = await eng.async_generate(input_ids=list(prompts[i]), sampling_params=sampling, stream=True)
        async for out in stream:
            if i == 0 and not started.is_set() and len(out.get("output_ids") or []) >= after_tokens:
                started.set()

    async def trigger() -> None:
        await started.wait()
        from sglang.srt.managers.io_struct import ProfileReq

        req = ProfileReq(output_dir=str(out_dir), num_steps=steps, activities=["GPU"], with_stack=False,
                         record_shapes=False, profile_prefix="decode")  # fmt: skip
        await eng.tokenizer_manager.start_profile(req)

    profiling = asyncio.ensure_future(trigger())
    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    if not started.is_set():
        profiling.cancel()
        return {"error": f"no request reached {after_tokens} output tokens: nothing was profiled"}
    await profiling
    traces = sorted(out_dir.glob("*.trace.json*"))
    if not traces:
        return {"error": f"SGLang wrote no trace under {out_dir} (see the scheduler log)"}
    return {"trace": traces[-1].name, **summarize_trace(load_trace(traces[-1]), layers)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--layers", type=int, required=True, help="the model's attention layers")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    print(json.dumps(summarize_trace(load_trace(a.trace), a.layers, a.top), indent=1))


if __name__ == "__main__":
    main()
