"""The decode-attention benchmark's timer and everything it measures besides zipkv: the read floor (a
streaming read of every stored byte), the float64 reference, and the named baselines on the same values:
FlashInfer's BatchDecodeWithPagedKVCacheWrapper (tensor cores), SGLang's Triton decode kernel and cuDNN
SDPA. bench/kernels/bench_decode_attention.py runs them side by side with zipkv.
"""

# The timed closures are built and returned on purpose.

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from zipkv.kernels.reference.attention import decode_attention_reference

HQ, HKV, HEAD_DIM = 32, 8, 128


@triton.jit
def _read_kernel(x_ptr, n_words, words_per_program, out_ptr, BLOCK: tl.constexpr):
    """Each program streams its own contiguous range, two independent 16-byte loads per thread in flight."""
    pid = tl.program_id(0)
    lo = pid.to(tl.int64) * words_per_program
    hi = tl.minimum(lo + words_per_program, n_words)
    acc = tl.zeros([BLOCK], tl.int32)
    for start in range(lo, hi, 2 * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        a = tl.load(x_ptr + offs, mask=offs < hi, other=0)
        b = tl.load(x_ptr + offs + BLOCK, mask=offs + BLOCK < hi, other=0)
        acc ^= a ^ b
    tl.store(out_ptr + pid, tl.xor_sum(acc, 0))


class Timer:
    """CUDA-event timing with a 512 MiB L2 flush before each call (outside the events)."""

    def __init__(self, target_s: float, min_reps: int, max_reps: int, warmup_s: float = 0.1) -> None:
        self.flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        self.target_s, self.min_reps, self.max_reps = target_s, min_reps, max_reps
        self.warmup_s = warmup_s

    def median_us(self, fn: Callable[[], object], graph: bool = False) -> float:
        """Median time of ``fn``; ``graph``: of one replay of a CUDA graph holding one call, as a serving
        engine's decode step runs it (no host launch time in the figure)."""
        # Warm up for a fixed time, not a count: the case built between rows leaves the GPU idle long enough
        # to drop its clocks (345 MHz on an idle H100), and a few calls do not ramp them back. Without this
        # the first implementation timed in a row ran 0.7-8% slower than the same launch timed after it (H100,
        # 2026-12-07, docs/benchmarks.md).
        fn()  # any JIT compile first, so the warm-up below is all GPU work
        torch.cuda.synchronize()
        if graph:
            # Captured before the warm-up, which then runs the replay. Captured after it, the first config of
            # a row read 616 us where it reads 524 eager (H100, 2026-12-07, docs/benchmarks.md): the pattern
            # of the clock drop above, the GPU idle during the capture (not yet rerun in this order).
            fn = _as_graph(fn)
        t_end = time.perf_counter() + self.warmup_s
        while time.perf_counter() < t_end:
            self.flush.zero_()
            fn()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        once = time.perf_counter() - t0 + 2e-4
        reps = int(min(self.max_reps, max(self.min_reps, self.target_s / once)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends, strict=True):
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))
        return times[len(times) // 2]


def _as_graph(fn: Callable[[], object]) -> Callable[[], object]:
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch's docs ask
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def read_floor_fn(heap: torch.Tensor, nbytes: int) -> Callable[[], object]:
    words = heap[: (nbytes + 3) // 4 * 4].view(torch.int32)
    grid = torch.cuda.get_device_properties(0).multi_processor_count * 8
    block = 1024
    per = -(-words.numel() // grid // (2 * block)) * 2 * block
    out = torch.empty(grid, dtype=torch.int32, device="cuda")
    return lambda: _read_kernel[(grid,)](words, words.numel(), per, out, BLOCK=block, num_warps=4)


def rel_err(x: torch.Tensor, ref: torch.Tensor | None) -> float:
    assert ref is not None, "checks need the float64 reference"
    return float((x.double() - ref).norm() / ref.norm())


def reference(q: torch.Tensor, pages: torch.Tensor, batch: int, ctx: int, scale: float) -> torch.Tensor:
    """float64 oracle, one request at a time (the whole batch in float64 would not fit)."""
    per = ctx // 16
    out = []
    lens = torch.tensor([ctx], dtype=torch.int32)
    indptr = torch.tensor([0, per], dtype=torch.int32)
    for b in range(batch):
        ids = torch.arange(b * per, (b + 1) * per, device=pages.device, dtype=torch.int32)
        out.append(decode_attention_reference(q[b : b + 1], pages, ids, indptr, lens, scale)[0])
    return torch.stack(out)


def flashinfer_fn(pages, q, out, batch, ctx, scale):  # type: ignore[no-untyped-def]
    return flashinfer_ragged_fn(pages, q, out, [ctx] * batch, scale)


def flashinfer_ragged_fn(pages, q, out, lens, scale):  # type: ignore[no-untyped-def]
    """FlashInfer's tensor-core decode over ``pages`` (HND, 16 tokens a page), request b's pages after
    request b - 1's, ``lens`` tokens each."""
    import flashinfer

    counts = [-(-n // 16) for n in lens]
    ws = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=True)
    indptr = torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32, device="cuda")
    indices = torch.arange(sum(counts), dtype=torch.int32, device="cuda")
    last = torch.tensor([n - 16 * (c - 1) for n, c in zip(lens, counts, strict=True)], dtype=torch.int32,
                        device="cuda")  # fmt: skip
    wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16, sm_scale=scale)  # fmt: skip
    return lambda: wrapper.run(q, pages, out=out)


def sglang_fn(k_buf, v_buf, q, out, batch, ctx, scale):  # type: ignore[no-untyped-def]
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

    max_splits = 8
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    num_splits = torch.empty(batch, dtype=torch.int32, device="cuda")
    get_num_kv_splits_triton[(1,)](num_splits, seq_lens, batch, 1, HQ, HKV, max_splits, sms,
                                   MAX_NUM_SEQ=triton.next_power_of_2(batch))  # fmt: skip
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * ctx
    indices = torch.arange(batch * ctx, dtype=torch.int64, device="cuda")
    logits = torch.empty(batch, HQ, max_splits, HEAD_DIM, dtype=torch.float32, device="cuda")
    lse = torch.empty(batch, HQ, max_splits, dtype=torch.float32, device="cuda")

    def run(pdl: bool) -> None:
        decode_attention_fwd(q, k_buf, v_buf, out, indptr, indices, logits, lse, num_splits, max_splits,
                             scale, 1.0, 1.0, logit_cap=0.0, sinks=None, xai_temperature_len=-1,
                             has_mla=False, use_pdl=pdl, page_size=16)  # fmt: skip

    try:
        run(True)
        torch.cuda.synchronize()
        return lambda: run(True)
    except Exception:  # PDL needs launch support this Triton may lack; SGLang itself falls back too
        return lambda: run(False)


def sdpa_fn(k_buf, v_buf, q, batch, ctx, scale):  # type: ignore[no-untyped-def]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qg = q.view(batch, HKV, HQ // HKV, HEAD_DIM)  # a KV head's query heads as its query rows
    k = k_buf.view(batch, ctx, HKV, HEAD_DIM).transpose(1, 2)
    v = v_buf.view(batch, ctx, HKV, HEAD_DIM).transpose(1, 2)

    def run() -> torch.Tensor:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(qg, k, v, scale=scale)

    return run
