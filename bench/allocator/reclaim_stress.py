"""Reclaim under memory pressure: an SGLang-like workload through zipkv's real SGLang allocator (CPU).

SGLang 0.5.17 cannot run here, so its scheduler's memory rules are replayed over the real `ZipkvAllocator`
and `PagePool` (torch reference encoder) with `LruPrefixCache`, a stand-in for SGLang's radix cache:
requests arrive at random, prefill in chunks (admitted as SGLang admits: size + a page <= available +
evictable, then the shortfall evicted), decode a few tokens, and finish into the cache, which keeps them
until evicted. Pages are Llama-3.1-8B's (8 KV heads x 128, page format v3: 64 KiB raw) in 2 MiB chunks;
layers and the budget are scaled down to fit a CPU. An allocation that fails after SGLang's admission is
what SGLang turns into "Prefill out of memory" (its scheduler dies): the record keeps the pool's state then.

    python -m bench.allocator.reclaim_stress --layers 32 --raw-tokens 4096 --pass-pages 22

``--pass-pages`` scales the compaction pass's page bound (ledger.COMPACTION_MAX_PAGES, 2,048 for a full
8B pool of 32 layers x ~24k pages) to the scaled-down pool.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zipkv.allocator import PagePool
from zipkv.allocator import ledger as ledger_module
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.kernels.reference import pages as reference
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
from zipkv.worker.engines.sglang.reclaim import PrefixCache
from zipkv.worker.engines.sglang.slots import budget_bytes_for_tokens, virtual_pages_for_budget

CHUNK_PAGES = 32  # 2 MiB chunks of Llama-3.1-8B's 64 KiB raw pages: chunks of 32 raw pages at any page size


@dataclass(frozen=True)
class Workload:
    """The pool's shape and the requests' sizes. Defaults: Llama-3.1-8B's pages (8 KV heads x 128, page
    format v3) in a pool scaled down to a CPU; smaller heads keep the real pool's chunks per layer
    (about 760 for 388,608 raw tokens) at a CPU's cost."""

    layers: int = 4
    raw_tokens: int = 32768
    steps: int = 400
    seed: int = 0
    kv_heads: int = 8
    head_dim: int = 128
    prompt_log_mean: float = 6.0  # prompts: lognormal(this, 1) tokens, at most a third of the pool
    chunk_tokens: int = 21 * PAGE_TOKENS  # a prefill chunk (SGLang's chunked_prefill_size)
    output_tokens: int = (
        24  # outputs: uniform from a sixth of this to this (decode pages interleave requests)
    )

    @property
    def fmt(self) -> PageFormat:
        return PageFormat(head_dim=self.head_dim, num_kv_heads=self.kv_heads, version=3)


class LruPrefixCache:
    """Stand-in for SGLang's RadixCache: cached requests' slots in LRU order, evicted whole through the
    allocator's ``free_segment`` as ``RadixCache.evict`` does."""

    def __init__(self, alloc: ZipkvAllocator) -> None:
        self.alloc, self.entries = alloc, deque[torch.Tensor]()
        self.evicted_tokens = 0

    def evictable_tokens(self) -> int:
        return sum(int(e.numel()) for e in self.entries)

    def evict_tokens(self, n: int) -> int:
        done = 0
        while done < n and self.entries:
            slots = self.entries.popleft()
            self.alloc.free_segment(slots, start_pos=0)
            done += int(slots.numel())
        self.evicted_tokens += done
        return done

    def hooks(self) -> PrefixCache:
        return PrefixCache(self.evictable_tokens, self.evict_tokens)


@dataclass
class Running:
    """One request: its slots so far (int64 tensors, in order), prompt tokens left, output tokens left."""

    prompt_left: int
    output_left: int
    slots: list[torch.Tensor] = field(default_factory=list)
    tokens: int = 0


def make_allocator(w: Workload) -> ZipkvAllocator:
    fmt = w.fmt
    budget = budget_bytes_for_tokens(w.raw_tokens, fmt, w.layers)
    pool = PagePool(
        fmt,
        w.layers,
        budget,
        chunk_bytes=CHUNK_PAGES * fmt.raw_page_bytes,
        compression=True,
        max_pages=virtual_pages_for_budget(budget, fmt, w.layers, True),
    )
    return ZipkvAllocator(pool, "cpu", True)


def fill(alloc: ZipkvAllocator, slots: torch.Tensor, gen: torch.Generator) -> None:
    """Random bf16 K and V written into ``slots`` of every layer (what a forward step stores)."""
    fmt = alloc.pool.fmt
    shape = (slots.numel(), fmt.num_kv_heads, fmt.head_dim)
    for layer in range(alloc.pool.num_layers):
        k, v = (torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2))
        reference.store_tokens(alloc.pool.heap, alloc.pool.page_loc[layer], slots, k, v, fmt)


def pool_state(alloc: ZipkvAllocator, cache: LruPrefixCache) -> dict[str, Any]:
    """What the pool holds now, and what compression off would fit in the same budget."""
    stats = alloc.pool.stats()
    raw_slots = stats.budget_bytes // (alloc.pool.num_layers * alloc.pool.fmt.raw_page_bytes)
    return {
        "available_tokens": alloc.available_size(),
        "evictable_tokens": cache.evictable_tokens(),
        "headroom_pages": alloc.headroom_pages(),
        "uncompressed_headroom_pages": raw_slots - stats.used_pages,
        **{k: v for k, v in vars(stats).items() if isinstance(v, int | float)},
    }


def prefill_chunk(
    alloc: ZipkvAllocator, cache: LruPrefixCache, r: Running, gen: torch.Generator, chunk_tokens: int
) -> str:
    """One prefill chunk of ``r`` as SGLang's scheduler runs it: "skipped" (admission says no room),
    "ok", or "failed" (admitted, evicted the shortfall, and the allocation still failed)."""
    n = min(r.prompt_left, chunk_tokens)
    pages = -(-(r.tokens + n) // PAGE_TOKENS) - -(-r.tokens // PAGE_TOKENS)
    if pages * PAGE_TOKENS + PAGE_TOKENS > alloc.available_size() + cache.evictable_tokens():
        return "skipped"
    short = n + PAGE_TOKENS - alloc.available_size()
    if short > 0:
        cache.evict_tokens(short)
    last = r.slots[-1][-1:] if r.slots else torch.tensor([-1])
    before, after = torch.tensor([r.tokens]), torch.tensor([r.tokens + n])
    out = alloc.alloc_extend(before, before, after, after, last, n)
    if out is None:
        return "failed"
    alloc.compress_step()
    fill(alloc, out, gen)
    r.slots.append(out)
    r.prompt_left, r.tokens = r.prompt_left - n, r.tokens + n
    return "ok"


def decode_step(
    alloc: ZipkvAllocator, cache: LruPrefixCache, batch: list[Running], gen: torch.Generator
) -> str:
    """One decode step as SGLang's check_decode_mem and alloc_decode run it: "retracted" (no room after
    evicting the shortfall; SGLang would retract a request), "ok" or "failed"."""
    need = sum(1 for r in batch if r.tokens % PAGE_TOKENS == 0) * PAGE_TOKENS
    if alloc.available_size() < need:
        cache.evict_tokens(need - alloc.available_size())
    if alloc.available_size() < need:
        return "retracted"
    seq = torch.tensor([r.tokens + 1 for r in batch])
    out = alloc.alloc_decode(seq, seq, torch.cat([r.slots[-1][-1:] for r in batch]))
    if out is None:
        return "failed"
    alloc.compress_step()
    fill(alloc, out, gen)
    for r, slot in zip(batch, out.split(1), strict=True):
        r.slots.append(slot)
        r.tokens, r.output_left = r.tokens + 1, r.output_left - 1
    return "ok"


def pass_work(
    alloc: ZipkvAllocator,
    cache: LruPrefixCache,
    running: list[Running],
    w: Workload,
    rng: random.Random,
    gen: torch.Generator,
) -> list[tuple[str, str]]:
    """One scheduler pass's work: maybe a new request, one prefill chunk, one decode step of the prefilled
    requests; (kind, outcome) of each that ran. ``rng`` draws the requests, ``gen`` the KV written."""
    if rng.random() < 0.35:  # prompts of ~400 tokens (median), a long tail, at most a third of the pool
        prompt = min(max(PAGE_TOKENS, int(rng.lognormvariate(w.prompt_log_mean, 1.0))), w.raw_tokens // 3)
        running.append(Running(prompt, rng.randint(max(1, w.output_tokens // 6), w.output_tokens)))
    results = []
    if (r := next((r for r in running if r.prompt_left > 0), None)) is not None:
        results.append(("prefill", prefill_chunk(alloc, cache, r, gen, w.chunk_tokens)))
    if batch := [r for r in running if r.prompt_left == 0]:
        results.append(("decode", decode_step(alloc, cache, batch, gen)))
    return results


def pass_end(alloc: ZipkvAllocator, cache: LruPrefixCache, running: list[Running]) -> None:
    """The pass's end: finished requests go to the prefix cache, the pool takes its step."""
    for r in [r for r in running if r.prompt_left == 0 and r.output_left <= 0]:
        running.remove(r)
        cache.entries.append(torch.cat(r.slots))  # finished: the prefix cache keeps it
    alloc.compress_step()


def run(w: Workload) -> dict[str, Any]:
    alloc = make_allocator(w)
    cache = LruPrefixCache(alloc)
    alloc.prefix_cache = cache.hooks()
    rng, gen = random.Random(w.seed), torch.Generator().manual_seed(w.seed)
    running: list[Running] = []
    counts = {"ok": 0, "skipped": 0, "retracted": 0}
    for step in range(w.steps):
        for kind, result in pass_work(alloc, cache, running, w, rng, gen):
            if result == "failed":
                return {"failed": {"step": step, "kind": kind, **pool_state(alloc, cache)}, **counts}
            counts[result] = counts.get(result, 0) + 1
        pass_end(alloc, cache, running)
        if step % 50 == 0:
            print(
                f"[reclaim_stress] step {step}/{w.steps}: {json.dumps(pool_state(alloc, cache))}", flush=True
            )
    return {
        "failed": None,
        **counts,
        "evicted_tokens": cache.evicted_tokens,
        "final": pool_state(alloc, cache),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.allocator.reclaim_stress", description=__doc__.split("\n")[0]
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--raw-tokens", type=int, default=32768, help="the KV budget, in raw tokens")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--prompt-log-mean", type=float, default=6.0, help="prompts: lognormal(this, 1) tokens")
    p.add_argument("--chunk-tokens", type=int, default=21 * PAGE_TOKENS, help="a prefill chunk")
    p.add_argument(
        "--output-tokens", type=int, default=24, help="outputs: uniform from a sixth of this to this"
    )
    p.add_argument("--pass-pages", type=int, default=ledger_module.COMPACTION_MAX_PAGES)
    p.add_argument("--out", type=Path, default=None, help="also write the record here (JSON)")
    a = p.parse_args(argv)
    ledger_module.COMPACTION_MAX_PAGES = a.pass_pages
    t0 = time.monotonic()
    w = Workload(
        a.layers,
        a.raw_tokens,
        a.steps,
        a.seed,
        a.kv_heads,
        a.head_dim,
        a.prompt_log_mean,
        a.chunk_tokens,
        a.output_tokens,
    )
    record = {"args": vars(a) | {"out": str(a.out)}, **run(w)}
    record["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(record))
    if a.out is not None:
        a.out.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if record["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
