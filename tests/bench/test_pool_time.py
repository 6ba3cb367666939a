"""bench/sim/pool_time.py: the pool's time and the prefill cost read back from a scheduler log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim.pool_time import main, pool_time

T = "[2026-12-06 00:12:10] "


def prefill(new: int, pending: int, queued: int, tok_s: float) -> str:
    return (
        f"{T}Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: 0, token usage: 0.04, "
        f"#running-req: 0, #queue-req: {queued}, #pending-token: {pending}, cuda graph: False, "
        f"input throughput (token/s): {tok_s}"
    )


def pool(step: int, encode: float, restore: float, host: float, alloc: float, waited: float = 0.0) -> str:
    """A pool line as telemetry.log_pool_step writes it (end_step ``host`` is a part of ``alloc``)."""
    return (
        f"{T}zipkv pool step={step} compressed_pages=8169 raw_pages=11 encoding_pages=0 ratio=0.7530 "
        f"headroom_pages=17909 live_pages=8179 compressed_blocks=6 compressed_page_blocks=7 "
        f"block_fraction=0.9878 decode_reqs=0 end_step_host_ms={host} encode_gpu_ms={encode} "
        f"move_gpu_ms=0.5 restore_gpu_ms={restore} restores=3 alloc_host_ms={alloc} "
        f"waited_host_ms={waited} settle_host_ms=0.0 alloc_decode_host_ms={alloc - host} "
        f"compress_step_host_ms={host}"
    )


DECODE = (
    f"{T}Decode batch, #running-req: 1, #token: 2240, token usage: 0.01, cuda graph: True, "
    "gen throughput (token/s): 40.0, #queue-req: 0"
)

LOG = "\n".join(
    [
        prefill(8192, 5000, 0, 1000.0),  # first line: no gap known to be its own
        prefill(5000, 0, 1, 50000.0),  # back to back (pending before): 100 ms for 5000 tokens
        pool(128, encode=4.0, restore=2.0, host=1.5, alloc=2.0, waited=0.25),
        prefill(8192, 0, 0, 81920.0),  # back to back (one queued before): 100 ms for 8192 tokens
        DECODE,
        prefill(2000, 0, 0, 2.0),  # a decode line came between: not its own forward
        pool(256, encode=6.0, restore=0.0, host=2.5, alloc=3.5),
    ]
)


def test_the_prefill_cost_counts_back_to_back_batches_only_and_the_pool_time_is_summed() -> None:
    t = pool_time(LOG)
    assert (t.pool_lines, t.timed_lines, t.prefill_batches, t.back_to_back_batches) == (2, 2, 4, 2)
    assert t.prefill_new_tokens == 8192 + 5000 + 8192 + 2000
    assert t.prefill_ms_per_1k_tokens == pytest.approx(1e3 * 200.0 / 13192, abs=1e-4)
    assert t.device_ms == {"encode_gpu_ms": 10.0, "move_gpu_ms": 1.0, "restore_gpu_ms": 2.0}
    assert t.host_ms == {
        "alloc_host_ms": 5.5, "end_step_host_ms": 4.0, "waited_host_ms": 0.25, "settle_host_ms": 0.0
    }  # fmt: skip
    assert t.host_calls_ms == {"alloc_decode_host_ms": 1.5, "compress_step_host_ms": 4.0}
    assert t.restores == 6
    assert t.pool_device_ms_per_1k_tokens == pytest.approx(1e3 * 13.0 / 23384, abs=1e-4)
    # the allocator's total alone: end_step is inside it and is not counted twice
    assert t.pool_host_ms_per_1k_tokens == pytest.approx(1e3 * 5.5 / 23384, abs=1e-4)


def test_a_log_from_before_the_time_fields_parses_with_zero_time() -> None:
    old = "\n".join(line.split(" end_step_host_ms")[0] for line in LOG.splitlines())
    t = pool_time(old)
    assert t.pool_lines == 2 and t.timed_lines == 0
    assert sum(t.device_ms.values()) == 0.0 and t.pool_device_ms_per_1k_tokens == 0.0
    assert pool_time("").prefill_ms_per_1k_tokens is None  # no prefill: no cost, not a division by zero


def test_the_command_writes_one_entry_per_system_and_names_a_missing_log(tmp_path: Path) -> None:
    log = tmp_path / "replica_process.log"
    log.write_text(LOG)
    out = tmp_path / "pool_time.json"
    main(["--log", f"zipkv={log}", "--out", str(out)])
    assert json.loads(out.read_text())["systems"]["zipkv"]["restores"] == 6
    with pytest.raises(SystemExit, match="no such log"):
        main(["--log", f"zipkv={tmp_path / 'absent.log'}"])
    with pytest.raises(SystemExit):
        main(["--log", "no-equals-sign"])
