"""The SGLang end-to-end bench's metrics: real SGLang 0.5.17 log lines (H200, 2026-11-30), zipkv's pool
line as the allocator writes it, and the client's arrival events."""

# ruff: noqa: E501  (real log lines, kept whole)

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from bench.serving.bench_sglang_e2e import WORKLOADS, parse_runs, summarize
from bench.serving.sglang_e2e_metrics import (
    Stream,
    at_max_batch,
    client_metrics,
    compare_outputs,
    decode_lines,
    decode_phase,
    log_metrics,
    pool_lines,
    pool_metrics,
)
from zipkv.allocator import PagePool
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.kernels.reference import pages as reference
from zipkv.worker.engines.sglang import allocator as sglang_pool
from zipkv.worker.engines.sglang.slots import budget_bytes_for_tokens, virtual_pages_for_budget

# SGLang's Triton backend, offline_8192x256 at 46 * 8448 tokens: 45 running, then the 19 left.
TRITON_LOG = """\
[2026-11-30 14:53:27] Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 63.32
[2026-11-30 14:53:40] Decode batch, #running-req: 45, #token: 370800, token usage: 0.95, cuda graph: True, gen throughput (token/s): 70.97, #queue-req: 19
[2026-11-30 14:53:41] Decode batch, #running-req: 45, #token: 372240, token usage: 0.96, cuda graph: True, gen throughput (token/s): 2345.41, #queue-req: 19
[2026-11-30 14:53:41] Decode batch, #running-req: 45, #token: 374400, token usage: 0.96, cuda graph: True, gen throughput (token/s): 2345.17, #queue-req: 19
[2026-11-30 14:53:42] Decode batch, #running-req: 45, #token: 375840, token usage: 0.97, cuda graph: True, gen throughput (token/s): 2342.27, #queue-req: 19
[2026-11-30 14:53:43] Decode batch, #running-req: 45, #token: 378000, token usage: 0.97, cuda graph: True, gen throughput (token/s): 2341.56, #queue-req: 19
[2026-11-30 14:53:44] Decode batch, #running-req: 45, #token: 379440, token usage: 0.98, cuda graph: True, gen throughput (token/s): 2339.25, #queue-req: 19
[2026-11-30 14:53:45] Prefill batch, #new-seq: 2, #new-token: 16384, #cached-token: 0, token usage: 0.08, #running-req: 0, #queue-req: 15, #pending-token: 139264, cuda graph: False, input throughput (token/s): 3011.51
[2026-11-30 14:53:49] Decode batch, #running-req: 19, #token: 156256, token usage: 0.40, cuda graph: True, gen throughput (token/s): 247.01, #queue-req: 0
[2026-11-30 14:53:50] Decode batch, #running-req: 19, #token: 156864, token usage: 0.40, cuda graph: True, gen throughput (token/s): 1635.22, #queue-req: 0
[2026-11-30 14:19:27] zipkv pool: zipkv, budget 50935627776 bytes for 388608 raw tokens, 518144 virtual slots
"""


def test_decode_lines_at_the_largest_batch_from_a_real_log() -> None:
    lines = decode_lines(TRITON_LOG)
    assert [x.running for x in lines] == [45] * 6 + [19] * 2
    assert lines[0].queued == 19 and lines[-1].queued == 0
    m = at_max_batch(lines)
    assert m["max_running_requests"] == 45 and m["decode_lines_at_max_batch"] == 6
    # The median of the six intervals at 45: the first one held the prefill (70.97 tok/s) and must not count
    # as a mean would (1964 tok/s).
    assert m["decode_tokens_per_s_at_max_batch"] == pytest.approx((2341.56 + 2342.27) / 2, abs=0.1)
    assert m["decode_step_ms"] == pytest.approx(19.215, abs=0.01)  # the H200 baseline measured 19.20 ms
    assert at_max_batch([])["max_running_requests"] is None


def test_log_metrics_ignore_prefill_and_pool_start_lines() -> None:
    m = log_metrics(
        TRITON_LOG
        + "[x] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 9\n"
    )
    assert m["max_running_requests"] == 45 and m["retracted_requests"] == 3
    hits = "[x] Prefill batch, #new-seq: 2, #new-token: 2048, #cached-token: 4096, token usage: 0.01, \n"
    assert log_metrics(TRITON_LOG + hits + hits)["cached_prefill_tokens"] == 8192
    assert "compressed_block_fraction" not in m  # the pool's start line is not a step line
    assert m["first_error_lines"] == []
    assert log_metrics("RuntimeError: boom\n")["first_error_lines"] == ["RuntimeError: boom"]


def _pool_text(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, sglang_pool.ZipkvAllocator]:
    """Drive the real allocator on the CPU: one 48-token prefill for 3 requests, then decode steps."""
    fmt, layers = PageFormat(head_dim=64, num_kv_heads=1), 2
    budget = budget_bytes_for_tokens(64 * PAGE_TOKENS, fmt, layers) + 4 * fmt.raw_page_bytes
    pool = PagePool(
        fmt,
        layers,
        budget,
        chunk_bytes=4 * fmt.raw_page_bytes,
        max_pages=virtual_pages_for_budget(budget, fmt, layers, True),
    )
    alloc = sglang_pool.ZipkvAllocator(pool, "cpu", True)
    monkeypatch.setattr(sglang_pool, "LOG_EVERY_STEPS", 1)
    caplog.set_level(logging.INFO, logger="zipkv.worker.sglang")
    n = torch.tensor([40, 40, 40])
    out = alloc.alloc_extend(
        torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), n, n, torch.full((3,), -1), 120
    )
    assert out is not None
    alloc.compress_step()
    gen = torch.Generator().manual_seed(0)
    for layer in range(layers):  # smooth values: most blocks compress
        kv = (1 + torch.rand(120, 2, 1, 64, generator=gen)).to(torch.bfloat16)
        reference.store_tokens(pool.heap, pool.page_loc[layer], out, kv[:, 0], kv[:, 1], fmt)
    last = out.reshape(3, 40)[:, -1]
    for step in range(3):
        slots = alloc.alloc_decode(n + 1 + step, n + 1 + step, last)
        assert slots is not None
        alloc.compress_step()
        last = slots
    return caplog.text, alloc


def test_the_pool_line_carries_block_counts_and_decode_requests(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, alloc = _pool_text(caplog, monkeypatch)
    lines = pool_lines(text)
    assert [x["decode_reqs"] for x in lines] == [0, 3, 3, 3]  # the prefill step, then three decode steps
    st = alloc.pool.stats()
    last = lines[-1]
    assert last["compressed_pages"] == st.compressed_pages == 6  # two full pages per request
    assert last["compressed_blocks"] == st.compressed_blocks and st.compressed_blocks > 0
    assert (
        last["compressed_page_blocks"]
        == st.compressed_page_blocks
        == 6 * 2 * PageFormat(64, 1).blocks_per_page
    )
    m = pool_metrics(lines)
    assert m["compressed_block_fraction"] == pytest.approx(
        st.compressed_blocks / st.compressed_page_blocks, abs=1e-4
    )
    # Three partly written tail pages, one per request, and the padding page: nothing beyond.
    assert m["max_raw_pages_over_running"] == 0 and m["compression_keeps_pace"] is True
    # the host time of the allocator's calls, the ranks' agreements among them, summed over the lines
    assert m["alloc_host_ms"] == pytest.approx(sum(x["alloc_host_ms"] for x in lines), abs=0.1)
    assert 0.0 <= m["agreement_host_ms"] <= m["alloc_host_ms"]


def test_pool_metrics_flag_raw_pages_piling_up() -> None:
    line = "zipkv pool step={} compressed_pages=10 raw_pages={} encoding_pages=0 compressed_blocks=30 compressed_page_blocks=40 decode_reqs=4"
    ok = pool_lines("\n".join(line.format(s, r) for s, r in ((128, 5), (256, 9))))
    assert pool_metrics(ok)["compression_keeps_pace"] is True  # 4 tails + 4 just filled + padding
    lag = pool_lines("\n".join(line.format(s, r) for s, r in ((128, 5), (256, 9), (384, 14))))
    m = pool_metrics(lag)
    assert m["max_raw_pages_over_running"] == 9 and m["compression_keeps_pace"] is False
    assert m["raw_pages_over_running_first_last"] == [0, 9]
    assert m["compressed_block_fraction"] == 0.75
    assert pool_metrics([]) == {}


def test_decode_time_leaves_out_the_prefills() -> None:
    # Request 0 is prefilled at 1.0 s, request 1 at 2.0 s, then both decode at 2.1 and 2.2 s.
    a = Stream([1.0, 2.1, 2.2], [1, 1, 1])
    b = Stream([2.0, 2.1, 2.2], [1, 1, 1])
    d = decode_phase([a, b])
    assert d["decode_tokens"] == 4 and d["decode_s"] == pytest.approx(0.2)
    assert d["decode_tokens_per_s"] == pytest.approx(20.0)  # not 4 / 1.2 s over the whole span
    c = client_metrics([a, b])
    assert c["ttft_s_mean"] == pytest.approx(1.5) and c["wall_s"] == 2.2 and c["output_tokens"] == 6
    # A chunk with two tokens counts both; a first chunk of two carries one decode token.
    coalesced = decode_phase([Stream([1.0, 1.3], [2, 1])])
    assert coalesced["decode_tokens"] == 2 and coalesced["decode_s"] == pytest.approx(0.3)
    assert client_metrics([Stream([], [])])["requests_without_tokens"] == 1


def test_outputs_are_compared_request_by_request() -> None:
    assert compare_outputs(["a", "b", "c"], ["a", "b", "c"]) == {
        "identical": True,
        "requests": 3,
        "requests_differing": 0,
        "differing": [],
    }
    diff = compare_outputs(["a", "b", "c"], ["a", "x", "c"])
    assert diff["identical"] is False and diff["differing"] == [1]
    assert compare_outputs(["a"], None)["identical"] is None
    assert compare_outputs(["a"], ["a", "b"])["identical"] is False


def test_run_specs_and_cross_row_summary() -> None:
    runs = parse_runs("zipkv:m2,flashinfer:m2:online:200")
    assert runs[0].workload == WORKLOADS["offline"] and runs[0].timeout_s is None
    assert runs[1].workload.name == "online_1024x8192" and runs[1].timeout_s == 200
    for bad in ("zipkv", "vllm:m2", "zipkv:m9", "zipkv:m2:huge", "zipkv:m2:online:1:2"):
        with pytest.raises(SystemExit):
            parse_runs(bad)
    row = {"workload": "online_1024x8192", "milestone": "m2"}
    results: dict[str, Any] = {
        "rows": [
            {**row, "system": "zipkv", "request_sha256": ["a", "b"], "decode_tokens_per_s": 3000.0},
            {**row, "system": "zipkv_uncompressed", "request_sha256": ["a", "c"]},
            {**row, "system": "flashinfer", "decode_tokens_per_s": 2000.0},
        ]
    }
    summarize(results)
    assert results["greedy_tokens_identical"]["online_1024x8192"]["requests_differing"] == 1
    assert results["zipkv_over_flashinfer"] == {"online_1024x8192": {"decode_tokens_per_s": 1.5}}


def test_milestone_3_workloads_exercise_what_they_are_for() -> None:
    from bench.serving.sglang_e2e_config import BUDGET_TOKENS, MILESTONES

    chunk = MILESTONES["m3"]["chunked_prefill_size"]
    prefix = WORKLOADS["prefix"]
    assert prefix.input_tokens > chunk and 0 < prefix.shared_prefix_tokens <= chunk  # chunked, prefix cached
    evict = WORKLOADS["evict"]
    # more tokens than the budget holds, even counting zipkv's compression (3/4 of raw at best), so the
    # cache must evict; each request alone fits
    assert evict.requests * (evict.input_tokens + evict.output_tokens) * 3 // 4 > BUDGET_TOKENS
    assert evict.input_tokens + evict.output_tokens < BUDGET_TOKENS // 8
    assert evict.shared_prefix_tokens == 0
