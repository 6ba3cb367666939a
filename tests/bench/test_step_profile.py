"""bench/serving/step_profile.py: a decode step's kernels from a Chrome trace, per step and per group, and
the e2e bench's log cut at its profile pass."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from bench.serving import bench_sglang_e2e, step_profile
from bench.serving.step_profile import kernel_group, load_trace, summarize_trace


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("_decode_hopper_kernel", "attention_zipkv"),
        ("_merge_kernel", "attention_merge"),
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<...>", "attention_flashinfer"),
        ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"),
        ("_encode_pages_kernel", "kv_store"),
        ("fused_add_rmsnorm_kernel", "norm_rope_act"),
        ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*)", "norm_rope_act"),
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<KernelTraits<>>", "attention_flashinfer"),
        ("alloc_decode_kernel", "other"),  # SGLang's page allocation, not attention
        ("create_flashinfer_kv_indices_triton", "other"),
        ("void flashinfer::PersistentVariableLengthMergeStatesKernel<8u, 16u>", "attention_merge"),
        ("elementwise_kernel_argmax", "sampling"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", "other"),
    ],
)
def test_kernels_fall_into_their_groups(name: str, group: str) -> None:
    assert kernel_group(name) == group


def _trace(layers: int, steps: int, attn_us: float, gemm_us: float, gap_us: float) -> dict:
    """``steps`` decode steps of ``layers`` layers: attention, then a GEMM, ``gap_us`` idle after each."""
    events, ts = [], 0.0
    events.append({"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 1e6})  # not a kernel: ignored
    for _ in range(steps):
        for _ in range(layers):
            for name, dur in (("_decode_hopper_kernel", attn_us), ("nvjet_gemm", gemm_us)):
                events.append({"cat": "kernel", "name": name, "ts": ts, "dur": dur})
                ts += dur + gap_us
    return {"traceEvents": events}


def test_per_step_milliseconds_and_idle_gaps() -> None:
    s = summarize_trace(_trace(layers=4, steps=3, attn_us=300.0, gemm_us=100.0, gap_us=10.0), layers=4)
    assert s["steps"] == 3 and s["attention_launches"] == 12
    assert s["kernel_ms_per_step"] == pytest.approx(4 * 0.4)
    # the span counts the 23 gaps between the 24 kernels: (4800 + 230) us over 3 steps
    assert s["span_ms_per_step"] == pytest.approx(5.03 / 3, abs=1e-3)
    assert s["groups_ms_per_step"] == {"attention_zipkv": pytest.approx(1.2), "gemm": pytest.approx(0.4)}
    assert s["top_kernels_ms_per_step"][0] == {"name": "_decode_hopper_kernel", "group": "attention_zipkv",
                                               "ms": pytest.approx(1.2)}  # fmt: skip


def test_a_partial_step_counts_by_its_layers() -> None:
    trace = _trace(layers=4, steps=2, attn_us=300.0, gemm_us=100.0, gap_us=0.0)
    trace["traceEvents"] = trace["traceEvents"][:-2]  # the trace ends before the last layer
    s = summarize_trace(trace, layers=4)
    assert s["steps"] == 1.75
    assert s["kernel_ms_per_step"] == pytest.approx(7 * 0.4 / 1.75)


def test_a_trace_without_attention_says_so() -> None:
    s = summarize_trace({"traceEvents": [{"cat": "kernel", "name": "nvjet", "ts": 0, "dur": 5}]}, layers=32)
    assert "no attention kernels" in s["error"]
    with pytest.raises(ValueError, match="layers must be positive"):
        summarize_trace({"traceEvents": []}, layers=0)


def test_gzipped_traces_load(tmp_path: Path) -> None:
    path = tmp_path / "decode-TP-0.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(_trace(2, 1, 1.0, 1.0, 0.0), f)
    assert summarize_trace(load_trace(path), layers=2)["steps"] == 1


def test_the_profile_pass_stays_out_of_the_timed_metrics() -> None:
    """Decode lines after the child's mark are the profile pass's: the row's metrics ignore them."""
    timed = "".join(
        f"Decode batch, #running-req: 59, #token: 1, gen throughput (token/s): {t}, #queue-req: 5\n"
        for t in (2900.0, 2950.0, 2940.0)
    )
    profiled = "Decode batch, #running-req: 64, #token: 1, gen throughput (token/s): 100.0, #queue-req: 0\n"
    log_text = timed + bench_sglang_e2e.PROFILE_MARK + "\n" + profiled
    metrics = bench_sglang_e2e.timed_log_metrics(log_text)
    assert metrics["max_running_requests"] == 59
    assert metrics["decode_tokens_per_s_at_max_batch"] == 2940.0
    assert bench_sglang_e2e.timed_log_metrics(timed) == metrics  # a run without a profile pass
    assert bench_sglang_e2e.log_metrics(log_text)["max_running_requests"] == 64  # what the cut prevents


class _ShortEngine:
    """An engine whose requests each stream ``tokens`` output tokens, one at a time (no GPU, no SGLang)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    async def async_generate(
        self, input_ids: list[int], sampling_params: dict[str, Any], stream: bool
    ) -> Any:
        async def gen() -> Any:
            for n in range(1, self.tokens + 1):
                await asyncio.sleep(0)
                yield {"output_ids": list(range(n))}

        return gen()


def test_a_workload_too_short_to_profile_returns_instead_of_hanging(tmp_path: Path) -> None:
    # 8 output tokens: the profile would start after 4 (half of max_new_tokens), but the engine's streams
    # end after 3; the pass returns an error instead of waiting for a start that never comes.
    eng = _ShortEngine(tokens=3)
    run = step_profile.profile_decode_steps(eng, [[1, 2]] * 2, {"max_new_tokens": 8}, tmp_path, 4, layers=2)
    out = asyncio.run(asyncio.wait_for(run, timeout=10))
    assert out == {"error": "no request reached 4 output tokens: nothing was profiled"}
