"""The SGLang scheduler's pool stats reach the replica's /metrics through the shared board, across a real
process boundary: a child process plays the scheduler (zipkv's SGLang allocator over a real PagePool on
the CPU, with the timed encoder the seams install), the parent reads what it published."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from zipkv.allocator.device import default_encoder
from zipkv.worker.encode_timer import TimedEncoder
from zipkv.worker.engine_stats import ENCODE_MS_BUCKETS, EncodeCounts, KernelsInUse
from zipkv.worker.engines.sglang.kv_stats_board import ENV, PUBLISH_EVERY_STEPS, KVStatsBoard

KERNELS = KernelsInUse(decode="triton_fused", encode="triton", extend="restore", page_format="v2")

SCHEDULER = textwrap.dedent(
    f"""
    import torch
    from zipkv.allocator import PagePool
    from zipkv.allocator.device import default_encoder
    from zipkv.kernels.reference import pages as reference
    from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
    from zipkv.worker.encode_timer import TimedEncoder
    from zipkv.worker.engines.sglang.kv_stats_board import KVStatsBoard
    from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
    from zipkv.worker.engines.sglang.slots import budget_bytes_for_tokens, virtual_pages_for_budget

    fmt, layers = PageFormat(head_dim=64, num_kv_heads=1), 2
    budget = budget_bytes_for_tokens(64 * PAGE_TOKENS, fmt, layers) + 4 * fmt.raw_page_bytes
    pool = PagePool(fmt, layers, budget, chunk_bytes=4 * fmt.raw_page_bytes,
                    max_pages=virtual_pages_for_budget(budget, fmt, layers, True),
                    encoder=TimedEncoder(default_encoder(torch.device("cpu")), "cpu"))
    alloc = ZipkvAllocator(pool, "cpu", True)
    alloc.stats_board = KVStatsBoard.from_env()  # as the seams attach it
    n = 48 * PAGE_TOKENS
    out = alloc.alloc_extend(torch.tensor([0]), torch.tensor([0]), torch.tensor([n]), torch.tensor([n]),
                             torch.tensor([-1]), n)
    gen = torch.Generator().manual_seed(0)
    for layer in range(layers):
        k, v = (torch.randn(n, 1, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
        reference.store_tokens(pool.heap, pool.page_loc[layer], out, k, v, fmt)
    for _ in range({2 * PUBLISH_EVERY_STEPS}):
        alloc.compress_step()
    print(pool.stats().compressed_pages, pool.stats().used_bytes)
    """
)


def test_the_scheduler_process_publishes_its_pool_and_the_replica_reads_it() -> None:
    board = KVStatsBoard.create()
    try:
        assert board.read(KERNELS) is None  # nothing published yet
        env = {**os.environ, **board.env()}
        done = subprocess.run(
            [sys.executable, "-c", SCHEDULER], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        compressed, used_bytes = (int(x) for x in done.stdout.split())
        got = board.read(KERNELS)
        assert got is not None and got.kernels == KERNELS
        assert got.compressed_pages == compressed == 48  # the last publish saw every page compressed
        assert got.stored_bytes == used_bytes and 0 < got.stored_bytes < got.raw_bytes
        # 49 live page ids (48 + the padding page) at raw size over 2 layers: what they'd hold uncompressed
        assert got.raw_bytes == 49 * 2 * 4096
        assert got.encode.launches >= 1 and got.encode.pages >= 48
        assert sum(got.encode.latency_counts) == got.encode.launches  # CPU: each launch timed at once
        assert got.encode.latency_sum_ms > 0
    finally:
        board.close()
    assert not board.path.exists()


def test_a_board_is_named_only_where_the_replica_made_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert KVStatsBoard.from_env() is None
    monkeypatch.setenv(ENV, "/nonexistent/zipkv-kv-stats")  # a replica that has gone: no board
    assert KVStatsBoard.from_env() is None


def test_a_torn_read_is_retried_not_returned() -> None:
    board = KVStatsBoard.create()
    try:
        board.publish(_stats(pages=5))
        board._array[0] += 1  # a writer in the middle of an update
        assert board.read(KERNELS) is None
        board._array[0] += 1  # the update done
        stats = board.read(KERNELS)
        assert stats is not None and stats.compressed_pages == 5
    finally:
        board.close()


def _stats(pages: int):  # type: ignore[no-untyped-def]
    from zipkv.worker.engine_stats import KVStats

    counts = EncodeCounts(launches=2, pages=pages).observed(0.3).observed(70.0)
    return KVStats(1 << 20, 4096, 8192, 1, pages, 0, KERNELS, counts)


def test_encode_latency_lands_in_its_bucket() -> None:
    counts = _stats(3).encode
    assert counts.latency_counts[ENCODE_MS_BUCKETS.index(0.5)] == 1  # 0.3 ms: the (0.2, 0.5] bucket
    assert counts.latency_counts[ENCODE_MS_BUCKETS.index(100.0)] == 1
    assert sum(counts.latency_counts) == 2 and counts.latency_sum_ms == 70.3


def test_timed_encoder_counts_launches_and_pages_on_the_cpu() -> None:
    from zipkv.kernels.format.layout import PageFormat

    fmt = PageFormat(head_dim=64, num_kv_heads=1)
    calls: list[int] = []

    def encoder(heap, src, dst, meta, sizes, f):  # type: ignore[no-untyped-def]
        calls.append(int(src.numel()))
        default_encoder(torch.device("cpu"))(heap, src, dst, meta, sizes, f)

    timed = TimedEncoder(encoder, "cpu")
    heap = torch.zeros(16 * fmt.raw_page_bytes, dtype=torch.uint8)
    for n in (1, 3):
        src = torch.arange(n, dtype=torch.int64) * fmt.raw_page_bytes
        dst = src + 8 * fmt.raw_page_bytes
        meta = torch.empty((n, fmt.page_heads_per_page, fmt.meta_bytes), dtype=torch.uint8)
        timed(heap, src, dst, meta, torch.zeros(n, dtype=torch.int32), fmt)
    counts = timed.poll()
    assert calls == [1, 3] and (counts.launches, counts.pages) == (2, 4)
    assert sum(counts.latency_counts) == 2
