"""The pool's log line in the scheduler's log (telemetry.log_pool_step): the step's counters and, since the
previous line, the pool's own time (end_step and the allocator's calls on the host; encode, move and
prefix-restore launches on the device), in the key=value form bench/serving/sglang_e2e_metrics.py reads
back."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from test_sglang_pool import fill, make

from bench.serving.sglang_e2e_metrics import pool_lines
from zipkv.kernels.format.layout import PAGE_TOKENS
from zipkv.worker.engines.sglang import allocator as allocator_module
from zipkv.worker.engines.sglang.host_timing import HOST_TIMED


def test_the_pool_line_carries_the_pools_own_time_since_the_line_before(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(allocator_module, "LOG_EVERY_STEPS", 2)
    alloc = make()
    zero = torch.tensor([0])
    n = torch.tensor([4 * PAGE_TOKENS])
    slots = alloc.alloc_extend(zero, zero, n, n, torch.tensor([-1]), int(n))
    assert slots is not None
    fill(alloc, slots)
    assert alloc.host_s["alloc_extend"] > 0.0  # the allocator's calls on the scheduling path are timed
    with caplog.at_level(logging.INFO, logger="zipkv.worker.sglang"):
        for _ in range(4):  # lines at steps 2 and 4
            alloc.compress_step()
    lines = pool_lines("\n".join(r.getMessage() for r in caplog.records))
    assert [line["step"] for line in lines] == [2.0, 4.0]
    first, second = lines
    assert first["end_step_host_ms"] > 0.0  # two end_steps, at least one of them encoding four pages
    assert first["alloc_host_ms"] > 0.0  # alloc_extend and the compress_steps before the line
    # ... and per call: they add up to it (each printed to 0.1 ms)
    calls = [k for k in first if k.endswith("_host_ms") and k[: -len("_host_ms")] in HOST_TIMED]
    assert first["alloc_extend_host_ms"] > 0.0 and len(calls) == len(HOST_TIMED)
    assert abs(sum(first[k] for k in calls) - first["alloc_host_ms"]) <= 0.05 * len(calls) + 0.05
    assert first["waited_host_ms"] >= 0.0 and first["settle_host_ms"] == 0.0  # no reclaim: never settled
    # On the CPU no device span is timed: zero, not absent, so a log from any machine parses the same way
    assert first["encode_gpu_ms"] == first["move_gpu_ms"] == first["restore_gpu_ms"] == first["restores"] == 0
    assert second["end_step_host_ms"] >= 0.0
    # Each line took (and so reset) the pool's timings: none are left after the line at the last step
    assert alloc.pool.take_timings()["end_step_host_ms"] == 0.0
    assert alloc.host_s["alloc_extend"] == 0.0


def test_a_timed_call_inside_another_counts_once() -> None:
    from zipkv.worker.engines.sglang.host_timing import take_host_ms, time_host_calls

    class Alloc:
        def alloc_extend(self) -> None:
            time.sleep(0.02)
            self.free()  # as a reclaim's eviction does

        def free(self) -> None:
            time.sleep(0.02)

    a = Alloc()
    totals = time_host_calls(a, ("alloc_extend", "free"))
    a.alloc_extend()
    assert totals["free"] == 0.0 and 0.04 <= totals["alloc_extend"] < 0.2  # the outer call, with the inner
    a.free()
    assert 0.02 <= totals["free"] < 0.2
    taken = take_host_ms(totals)
    assert 60.0 <= sum(taken.values()) < 400.0 and set(taken) == {"alloc_extend", "free", "waited"}
    assert taken["waited"] == 0.0 and sum(take_host_ms(totals).values()) == 0.0  # reset by the take
