"""The page pool's own time in a serving run, read from the replica's log: what compression costs per prefill.

    python -m bench.sim.pool_time --log zipkv=W/zipkv/replica_process.log \
        --log zipkv_uncompressed=W/zipkv_uncompressed/replica_process.log \
        --out bench/results/serving_pool_time.json

Two kinds of line in one scheduler log:
- zipkv's pool line (worker/engines/sglang/telemetry.log_pool_step), every so many forward steps, with the
  pool's time since the line before: encode, move and prefix-restore launches on the device (CUDA events,
  completed ones only), and the allocator's calls on the host (in all, per call, and the parts of that
  spent in end_step or waiting for the device);
- SGLang's "Prefill batch" lines, whose new tokens over input throughput is the wall time since the previous
  prefill line (bench/sim/prefill_log.py); where the previous line still had prefill work waiting and no
  decode line came between ("back to back"), that gap is the batch's own forward.

Per system: the totals over the log; the measured prefill cost (ms per 1k new tokens over the back-to-back
batches, the figure the calibration fits); and the pool's time per 1k prefilled tokens. Encode also covers
pages that decoding filled; on the Mooncake trace outputs are ~2% of the tokens, so it is near all prefill.
A line from a log written before the timing fields existed counts as zero time (`timed_lines` says how many
carried them). Comparing the pool's ms per 1k tokens with the gap between zipkv's and its twin's prefill
cost says how much of that gap is the pool's own work, and how much is elsewhere.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.serving.sglang_e2e_metrics import pool_lines
from bench.sim.prefill_log import SWEEP_CHUNK_TOKENS, back_to_back, parse_lines

DEVICE_FIELDS = ("encode_gpu_ms", "move_gpu_ms", "restore_gpu_ms")
# alloc_host_ms is the allocator's calls on the scheduling path in all; the rest are parts of it: end_step
# (inside compress_step), and the host's waits for the device (blocking readback drains; settles, in
# reclaims and the decode check's room). Lines from before 2026-12-06 carry the first two only.
HOST_TOTAL = "alloc_host_ms"
HOST_PARTS = ("end_step_host_ms", "waited_host_ms", "settle_host_ms")
HOST_FIELDS = (HOST_TOTAL, *HOST_PARTS)


@dataclass(frozen=True)
class PoolTime:
    pool_lines: int
    timed_lines: int  # pool lines that carry the time fields
    prefill_batches: int
    prefill_new_tokens: int
    back_to_back_batches: int
    back_to_back_tokens: int  # their new tokens
    back_to_back_ms: float  # their summed gaps: their own forwards
    prefill_ms_per_1k_tokens: float | None  # back_to_back_ms per 1k of back_to_back_tokens
    device_ms: dict[str, float]  # summed over the log, per field of DEVICE_FIELDS
    host_ms: dict[str, float]  # per field of HOST_FIELDS: the total and its parts
    host_calls_ms: dict[str, float]  # the total by allocator call (CALL_host_ms fields; newer logs)
    restores: int
    pool_device_ms_per_1k_tokens: float | None  # all of device_ms per 1k prefilled tokens
    pool_host_ms_per_1k_tokens: float | None


def per_1k(ms: float, tokens: int) -> float | None:
    return round(1e3 * ms / tokens, 4) if tokens > 0 else None


def pool_time(text: str) -> PoolTime:
    """The pool's time and the prefill cost of one scheduler log (module doc)."""
    pools = pool_lines(text)
    prefills = parse_lines(text.splitlines())
    device = {f: round(sum(p.get(f, 0.0) for p in pools), 3) for f in DEVICE_FIELDS}
    host = {f: round(sum(p.get(f, 0.0) for p in pools), 3) for f in HOST_FIELDS}
    call_names = sorted({k for p in pools for k in p if k.endswith("_host_ms") and k not in HOST_FIELDS})
    calls = {k: round(sum(p.get(k, 0.0) for p in pools), 3) for k in call_names}
    new_tokens = sum(p.new_tokens for p in prefills)
    back = back_to_back(prefills, SWEEP_CHUNK_TOKENS)  # chunked prompts rebuilt at the sweep's chunk size
    back_tokens, back_ms = sum(b.new_tokens for b in back), sum(b.gap_ms for b in back)
    return PoolTime(
        pool_lines=len(pools),
        timed_lines=sum("encode_gpu_ms" in p for p in pools),
        prefill_batches=len(prefills),
        prefill_new_tokens=new_tokens,
        back_to_back_batches=len(back),
        back_to_back_tokens=back_tokens,
        back_to_back_ms=round(back_ms, 3),
        prefill_ms_per_1k_tokens=per_1k(back_ms, back_tokens),
        device_ms=device,
        host_ms=host,
        host_calls_ms=calls,
        restores=int(sum(p.get("restores", 0.0) for p in pools)),
        pool_device_ms_per_1k_tokens=per_1k(sum(device.values()), new_tokens),
        pool_host_ms_per_1k_tokens=per_1k(host[HOST_TOTAL], new_tokens),
    )


def parse_log_arg(arg: str) -> tuple[str, Path]:
    name, sep, path = arg.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--log {arg!r}: expected SYSTEM=PATH (zipkv=replica_process.log)")
    return name, Path(path)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", action="append", type=parse_log_arg, required=True, help="SYSTEM=PATH")
    ap.add_argument("--out", type=Path, help="write the JSON here (else print it)")
    args = ap.parse_args(argv)
    missing = [str(p) for _, p in args.log if not p.is_file()]
    if missing:
        raise SystemExit(f"pool_time: no such log: {', '.join(missing)} (give each system's replica log)")
    out = {name: asdict(pool_time(path.read_text(errors="replace"))) for name, path in args.log}
    text = json.dumps({"systems": out}, indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text + "\n")
        print(f"pool_time: wrote {args.out}")


if __name__ == "__main__":
    main()
