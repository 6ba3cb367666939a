"""Bookkeeping cost of the allocator per decode step: batch 256, Llama-3.1-8B shapes (32 layers).

Drives the allocator's host ledger (``zipkv.allocator.Ledger``: everything ``PagePool`` computes on the
host) through a steady state: 256 running requests of 768 prompt + 512 output tokens, staggered so that one
finishes about every other step and a new one is admitted (reserve, prompt pages allocated and queued for
compression). Per step: one ``allocate`` for the requests that cross a page boundary, one ``mark_full``,
frees and reservations of finished and new requests, ``end_step`` (apply last step's sizes, plan one
encode launch for all layers, compaction every 8 steps) and ``new_pages_fit``. The encoder's sizes are
drawn (Binomial blocks at the measured compressible fraction) outside the timed region and arrive one step
after their launch, as on the GPU. CPU time of the thread (``time.thread_time_ns``), per step.

Not included: the device-side calls ``PagePool`` issues per step (about a dozen torch launches and small
host-to-device copies); they are asynchronous and are not measured here.

    python bench/allocator_step.py     # writes bench/results/allocator_step.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from admission import FMT, LAYERS, kv_budget_bytes, make_ledger, measured_fractions

from zipkv.allocator import Ledger
from zipkv.allocator.plans import EncodePlan
from zipkv.kernels.layout import COMPRESSED_BLOCK_BYTES, PAGE_TOKENS, RAW_BLOCK_BYTES

ROOT = Path(__file__).resolve().parents[1]
BATCH, PROMPT_TOKENS, OUTPUT_TOKENS = 256, 768, 512
COMPACTION_INTERVAL_STEPS = 8


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
        self.max_pages = (PROMPT_TOKENS + OUTPUT_TOKENS) // PAGE_TOKENS
        for i in range(BATCH):  # staggered: request i has decoded 2 i tokens (mod the output length)
            self.admit(decoded=(2 * i) % OUTPUT_TOKENS)
            self.end_step()
            self.clock[0] += 1

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

    def end_step(self) -> None:
        led = self.led
        led.poll()
        plan = led.plan_encode()
        if plan is not None:
            stored = self.sizes(plan)  # the device's answer; drawn here, read a step later
            led.launched(plan, StepFence(self.clock), lambda: stored)
        if self.clock[0] % COMPACTION_INTERVAL_STEPS == 0 and (move := led.plan_compaction()) is not None:
            led.moved(move)
        led.poll()

    def step(self) -> int:
        """One decode step; returns thread CPU ns spent in the allocator (sizes drawn outside)."""
        t0 = time.thread_time_ns()
        led = self.led
        need = [rid for rid, t in self.tokens.items() if t % PAGE_TOKENS == 0]
        if need:
            ids, _ = led.allocate(len(need), need)
            for rid, page in zip(need, ids.tolist(), strict=True):
                self.pages[rid].append(page)
        full = []
        done = []
        for rid in self.tokens:
            self.tokens[rid] += 1
            if self.tokens[rid] % PAGE_TOKENS == 0:
                full.append(self.pages[rid][-1])
            if self.tokens[rid] == PROMPT_TOKENS + OUTPUT_TOKENS:
                done.append(rid)
        led.mark_full(full)
        for rid in done:
            led.free(self.pages.pop(rid))
            led.release(rid)
            del self.tokens[rid]
        t1 = time.thread_time_ns()
        draw = 0
        for _ in done:
            self.admit()
        t2 = time.thread_time_ns()
        led.poll()
        plan = led.plan_encode()
        t3 = time.thread_time_ns()
        if plan is not None:
            stored = self.sizes(plan)
            draw = time.thread_time_ns() - t3
            led.launched(plan, StepFence(self.clock), lambda: stored)
        if self.clock[0] % COMPACTION_INTERVAL_STEPS == 0 and (move := led.plan_compaction()) is not None:
            led.moved(move)
        led.poll()
        led.new_pages_fit()
        self.clock[0] += 1
        t4 = time.thread_time_ns()
        self.last_admission_ns = t2 - t1
        return t4 - t0 - draw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/allocator_step.json")
    args = parser.parse_args()
    fraction, _, source = measured_fractions()
    work = Workload(fraction)
    for _ in range(args.warmup):
        work.step()
    total, admission = [], []
    for _ in range(args.steps):
        total.append(work.step())
        admission.append(work.last_admission_ns)
    total_us = np.array(total) / 1e3
    decode_us = (np.array(total) - np.array(admission)) / 1e3
    stats = work.led
    result = {
        "command": "python bench/allocator_step.py",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} CPU ({platform.processor() or 'unknown'}), Python "
        f"{platform.python_version()}, numpy {np.__version__}; shared with other work",
        "batch": BATCH,
        "layers": LAYERS,
        "steps": args.steps,
        "cpu_us_p50": round(float(np.percentile(total_us, 50)), 1),
        "cpu_us_p99": round(float(np.percentile(total_us, 99)), 1),
        "cpu_us_max": round(float(total_us.max()), 1),
        "decode_only_cpu_us_p50": round(float(np.percentile(decode_us, 50)), 1),
        "decode_only_cpu_us_p99": round(float(np.percentile(decode_us, 99)), 1),
        "includes": "allocate, mark_full, free + release + admission (reserve, prompt allocate) of "
        "turnover, poll (sizes a step later), plan_encode, compaction every 8 steps, new_pages_fit",
        "compressible_fraction": round(fraction, 4),
        "fraction_source": source,
        "running_requests": len(work.tokens),
        "pool_chunks_free": len(stats.pool),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| batch | layers | CPU us p50 | CPU us p99 | decode-only p50 | decode-only p99 |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {BATCH} | {LAYERS} | {result['cpu_us_p50']} | {result['cpu_us_p99']} | "
        f"{result['decode_only_cpu_us_p50']} | {result['decode_only_cpu_us_p99']} |"
    )


if __name__ == "__main__":
    main()
