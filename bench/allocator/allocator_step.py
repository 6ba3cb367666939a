"""Bookkeeping cost of the allocator per decode step: batch 256, Llama-3.1-8B shapes (32 layers).

Drives the allocator's host ledger (``zipkv.allocator.Ledger``: everything ``PagePool`` computes on the
host) through a steady state: 256 running requests of 768 prompt + 512 output tokens, staggered so that one
finishes about every other step and a new one is admitted (reserve, prompt pages allocated and queued for
compression). Per step: one ``allocate`` for the requests that cross a page boundary, one ``mark_full``,
frees and reservations of finished and new requests, ``end_step`` (apply last step's sizes, plan one
encode launch for all layers, compaction every 8 steps) and ``headroom_pages``. The encoder's sizes are
drawn (Binomial blocks at the measured compressible fraction) outside the timed region and arrive one step
after their launch, as on the GPU. CPU time of the thread (``time.thread_time_ns``), per step.

Not included: the device-side calls ``PagePool`` issues per step (about a dozen torch launches and small
host-to-device copies); they are asynchronous and are not measured here.

    python -m bench.allocator.allocator_step     # writes bench/results/allocator_step.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.allocator.admission import FMT, LAYERS, cpu_name, kv_budget_bytes, make_ledger
from bench.allocator.admission_sizes import load_study, study_fractions
from bench.paths import RESULTS
from zipkv.allocator import Ledger, PagePool
from zipkv.allocator.plans import EncodePlan
from zipkv.kernels.format.layout import COMPRESSED_BLOCK_BYTES, PAGE_TOKENS, RAW_BLOCK_BYTES

BATCH, PROMPT_TOKENS, OUTPUT_TOKENS = 256, 768, 512
COMPACTION_INTERVAL_STEPS = PagePool.DEFAULT_COMPACTION_INTERVAL_STEPS


class StepFence:
    """Done once the step after its launch has begun (the GPU finishes a launch within a step)."""

    def __init__(self, clock: list[int]) -> None:
        self.clock, self.launched_at = clock, clock[0]

    def done(self) -> bool:
        return self.clock[0] > self.launched_at


class Workload:
    def __init__(self, fraction: float, seed: int = 0) -> None:
        self.led: Ledger = make_ledger(kv_budget_bytes(), compression=True, shared_pool=True)
        self.clock = [0]
        self.led.new_fence = lambda: StepFence(self.clock)
        self.rng = np.random.default_rng(seed)
        self.fraction = fraction
        self.pages: dict[str, list[int]] = {}
        self.tokens: dict[str, int] = {}
        self.count = 0
        self.decode_steps = 0
        self.max_pages = (PROMPT_TOKENS + OUTPUT_TOKENS) // PAGE_TOKENS
        for i in range(BATCH):  # staggered: request i has decoded 2 i tokens (mod the output length)
            self.admit(decoded=(2 * i) % OUTPUT_TOKENS)
            self.end_step_timed()

    def sizes(self, plan: EncodePlan) -> np.ndarray:
        c = self.rng.binomial(FMT.blocks_per_page, self.fraction, plan.size)
        return c * COMPRESSED_BLOCK_BYTES + (FMT.blocks_per_page - c) * RAW_BLOCK_BYTES

    def admit(self, decoded: int = 0) -> None:
        rid = f"r{self.count}"
        self.count += 1
        tokens = PROMPT_TOKENS + decoded
        n = -(-tokens // PAGE_TOKENS)
        self.led.reserve(rid, self.max_pages)
        ids, _ = self.led.allocate(n, rid)
        self.led.mark_full(ids[: tokens // PAGE_TOKENS])
        self.pages[rid], self.tokens[rid] = ids.tolist(), tokens

    def decode_step(self) -> int:
        """One decode step; returns the thread CPU ns spent in allocator calls (the scheduler's own
        per-request loop and the drawing of sizes are not counted)."""
        led = self.led
        need = [rid for rid, t in self.tokens.items() if t % PAGE_TOKENS == 0]
        t0 = time.thread_time_ns()
        ids = led.allocate(len(need), need)[0].tolist() if need else []  # all layers, one call
        spent = time.thread_time_ns() - t0
        for rid, page in zip(need, ids, strict=True):
            self.pages[rid].append(page)
        full, done = [], []
        for rid in self.tokens:
            self.tokens[rid] += 1
            if self.tokens[rid] % PAGE_TOKENS == 0:
                full.append(self.pages[rid][-1])
            if self.tokens[rid] == PROMPT_TOKENS + OUTPUT_TOKENS:
                done.append(rid)
        finished = [(rid, self.pages.pop(rid)) for rid in done]
        for rid in done:
            del self.tokens[rid]
        t1 = time.thread_time_ns()
        led.mark_full(full)
        for rid, pages in finished:
            led.free(pages)
            led.release(rid)
        spent += time.thread_time_ns() - t1
        self.decode_steps += 1
        spent += self.end_step_timed(compact=self.decode_steps % COMPACTION_INTERVAL_STEPS == 0)
        t2 = time.thread_time_ns()
        led.headroom_pages()
        return spent + time.thread_time_ns() - t2

    def end_step_timed(self, compact: bool = False) -> int:
        """``end_step`` as PagePool runs it; returns CPU ns without drawing the sizes."""
        t0 = time.thread_time_ns()
        led = self.led
        led.poll()
        plan = led.plan_encode()
        draw = 0
        if plan is not None:
            t1 = time.thread_time_ns()
            stored = self.sizes(plan)
            draw = time.thread_time_ns() - t1
            led.launched(plan, StepFence(self.clock), lambda: stored)
        if compact and (move := led.plan_compaction()) is not None:
            led.moved(move)
        led.poll()
        self.clock[0] += 1  # the device finishes this step's launches before the next step
        return time.thread_time_ns() - t0 - draw

    def prefill_step(self) -> int:
        """Admit requests until BATCH run again (reserve, prompt pages, compress them); CPU ns."""
        t0 = time.thread_time_ns()
        while len(self.tokens) < BATCH:
            self.admit()
        spent = time.thread_time_ns() - t0
        return spent + self.end_step_timed()


def chunk_step(work: Workload, pages: int, rid: str) -> tuple[int, int, int]:
    """One prefill chunk of ``pages`` pages per layer (SGLang's chunked prefill: 8192 tokens = 512 pages):
    CPU ns of reserve + allocate + mark_full, of the end_step that plans their encode, and of the next
    end_step, which takes the launch's sizes in (exact places, refunds, raw slots freed); then frees them."""
    led = work.led
    t0 = time.thread_time_ns()
    led.reserve(rid, pages)
    ids, _ = led.allocate(pages, rid)
    led.mark_full(ids)
    admit = time.thread_time_ns() - t0
    plan, settle = work.end_step_timed(), work.end_step_timed()
    led.free(ids.tolist())
    led.release(rid)
    work.end_step_timed()
    return admit, plan, settle


def chunk_main(pages: int, steps: int, out: Path) -> None:
    """The host cost of prefill chunks of ``pages`` pages, on a pool emptied of the steady-state batch."""
    work = Workload(study_fractions(load_study(), "minilm", FMT.version, LAYERS).mean)
    for rid, ids in list(work.pages.items()):
        work.led.free(ids)
        work.led.release(rid)
    work.pages.clear()
    work.tokens.clear()
    work.end_step_timed()
    times = np.array([chunk_step(work, pages, f"c{i}") for i in range(steps)]) / 1e6
    parts = ("admit_ms", "plan_encode_step_ms", "settle_step_ms")
    result = {
        "command": f"python -m bench.allocator.allocator_step --chunk-pages {pages} --steps {steps}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{cpu_name()} ({os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}), "
        f"Python {platform.python_version()}, numpy {np.__version__}",
        "layers": LAYERS,
        "chunk_pages": pages,
        "chunk_tokens": pages * PAGE_TOKENS,
        "steps": steps,
        "cpu_ms_p50": {k: round(float(np.median(times[:, i])), 3) for i, k in enumerate(parts)},
        "cpu_ms_p50_total": round(float(np.median(times.sum(axis=1))), 3),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["cpu_ms_p50"]), "total", result["cpu_ms_p50_total"], "ms ->", out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None, help="default: allocator_step[_chunk].json")
    parser.add_argument(
        "--chunk-pages",
        type=int,
        default=0,
        help="instead: the host cost of prefill chunks of this many pages",
    )
    args = parser.parse_args()
    if args.chunk_pages > 0:
        chunk_main(args.chunk_pages, args.steps, args.out or RESULTS / "allocator_step_chunk.json")
        return
    steady_main(args.steps, args.warmup, args.out or RESULTS / "allocator_step.json")


def steady_main(steps: int, warmup: int, out: Path) -> None:
    """The steady state of the module doc: decode and prefill steps of a batch of BATCH."""
    # the bookkeeping cost hardly depends on the fraction: MiniLM's mean under v2, as when first measured
    measured = study_fractions(load_study(), "minilm", FMT.version, LAYERS)
    fraction, source = measured.mean, measured.source
    work = Workload(fraction)
    for _ in range(warmup):
        work.decode_step()
        work.prefill_step()
    decode, prefill = [], []
    for _ in range(steps):
        decode.append(work.decode_step())
        if len(work.tokens) < BATCH:
            prefill.append(work.prefill_step())
    decode_us, prefill_us = np.array(decode) / 1e3, np.array(prefill) / 1e3
    stats = work.led
    result = {
        "command": "python -m bench.allocator.allocator_step",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{cpu_name()} ({os.cpu_count()} cores, shared with other work; load average "
        f"{os.getloadavg()[0]:.1f}), Python {platform.python_version()}, numpy {np.__version__}",
        "batch": BATCH,
        "layers": LAYERS,
        "steps": steps,
        "cpu_us_p50": round(float(np.percentile(decode_us, 50)), 1),
        "cpu_us_p99": round(float(np.percentile(decode_us, 99)), 1),
        "cpu_us_max": round(float(decode_us.max()), 1),
        "decode_step_includes": "one allocate for the requests starting a page, mark_full, free + release of "
        "finished requests, end_step (poll: sizes of the last launch; plan one encode launch; compaction "
        f"every {COMPACTION_INTERVAL_STEPS} steps), headroom_pages",
        "prefill_steps": len(prefill),
        "prefill_step_cpu_us_p50": round(float(np.percentile(prefill_us, 50)), 1),
        "prefill_step_cpu_us_p99": round(float(np.percentile(prefill_us, 99)), 1),
        "prefill_step_includes": f"reserve + allocate {PROMPT_TOKENS // PAGE_TOKENS} prompt pages of each "
        "admitted request, mark_full, end_step (their encode launch)",
        "compressible_fraction": round(fraction, 4),
        "fraction_source": source,
        "running_requests": len(work.tokens),
        "pool_chunks_free": len(stats.pool),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("| step | batch | layers | CPU us p50 | CPU us p99 |")
    print("|---|---|---|---|---|")
    print(f"| decode | {BATCH} | {LAYERS} | {result['cpu_us_p50']} | {result['cpu_us_p99']} |")
    print(
        f"| prefill (admits 1-2) | {BATCH} | {LAYERS} | {result['prefill_step_cpu_us_p50']} | "
        f"{result['prefill_step_cpu_us_p99']} |"
    )


if __name__ == "__main__":
    main()
