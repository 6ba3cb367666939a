"""allocator_step.py --chunk-pages: one prefill chunk's host cost, and the pool left as found."""

from __future__ import annotations

import time

from bench.allocator.allocator_step import Workload, chunk_step


def test_a_chunk_is_timed_in_three_parts_and_gives_back_every_page() -> None:
    work = Workload(0.95)
    for _ in range(3):  # the steady batch's last encodes settle first
        work.end_step_timed()
    before = work.led.headroom_pages()
    t0 = time.thread_time_ns()
    admit, plan, settle = chunk_step(work, 64, "c0")
    spent = time.thread_time_ns() - t0
    assert admit > 0 and plan > 0 and settle > 0
    assert admit + plan + settle <= spent  # parts of the call, not more than it
    work.end_step_timed()
    assert work.led.headroom_pages() == before  # encoded, settled, freed: nothing leaks
