"""Calibration source `h100_serving_logs`: worker step models fitted to the H100 serving sweep's own logs.

    python -m bench.sim.h100_calibration      # -> bench/results/sim_calibration_h100_serving_logs.json

The H200 calibration (step_model.py + sim_calibrate.py, `h200_e2e`) fits uniform-batch runs on another
GPU; this one reads what the H100 runs of bench/results/serving_goodput_one_machine.json logged while serving
the trace (one H100, Llama-3.1-8B shape, SGLang 0.5.17), per system:

Decode: bench/results/serving_decode_steps.json's decode-only intervals (SGLang's "Decode batch" lines,
bench/serving/log_steps.py), refitted as step_ms = fixed_ms + slope x kv_tokens. Under zipkv with compression
on, SGLang's used-token count reads low by the compression ratio (the same first burst of 9 requests logs
80,224 tokens under zipkv and 102,896 under SGLang: 0.78), so the slope per raw context token is the fitted
one x KV_COUNT_FACTOR (the measured ratio, 0.7618).

Prefill: the servers' "Prefill batch" lines (bench/sim/prefill_log.py) from the sweep's record archives:
the attention slope per (new, context) token pair from consecutive chunks of one prompt, then the per-token
cost with the decode fit's fixed part as a batch's floor. SGLang's own server (its default attention
backend), zipkv with FlashInfer prefill and zipkv with Triton extend are fitted separately: their attention
over a cached prefix differs up to 4x.

The sweep's systems map to these models by name (sglang_gateway -> sglang). The fitted numbers, with the
decode and prefill residuals, go to bench/results/sim_calibration_h100_serving_logs.json, which the
simulation reads; rerun this after new logs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.serving.log_steps import line_fit
from bench.serving.trace_workload import KV_BYTES_PER_TOKEN
from bench.sim.prefill_log import SWEEP_CHUNK_TOKENS, PrefillFit, fit_prefill, parse_lines, rebuild_batches
from bench.sim.sim_calibrate import compression_ratio
from bench.sim.step_model import StepModel

NAME = "h100_serving_logs"
RECORD = RESULTS / "sim_calibration_h100_serving_logs.json"
DECODE_STEPS = RESULTS / "serving_decode_steps.json"
CHUNK_TOKENS = SWEEP_CHUNK_TOKENS
ZIPKV_RATIO = compression_ratio("zipkv")  # compressed / raw bytes, measured (sglang_e2e.json)


@dataclass(frozen=True, slots=True)
class LogSource:
    archive: str  # under bench/results/
    member: str  # the server log inside it
    decode_key: str  # its system in serving_decode_steps.json
    kv_count_factor: float  # logged KV tokens / raw context tokens
    decode_steps: str = DECODE_STEPS.name  # the file under bench/results/ that holds decode_key


ONE_MACHINE = "serving_goodput_one_machine_records.tgz"  # all three systems on one H100, 2026-12-06
ONE_MACHINE_STEPS = "serving_decode_steps_one_machine.json"  # its decode points, both trace windows

# Prefill lines from window 0's logs (the heavier window: more chained chunks to fit on); decode points from
# both windows'. zipkv with Triton extend ran only in the balanced-split session, on another machine.
SOURCES = {
    "sglang": LogSource(
        ONE_MACHINE, "w0/sglang_gateway/sglang_server.log", "sglang_server", 1.0, ONE_MACHINE_STEPS
    ),
    "zipkv": LogSource(ONE_MACHINE, "w0/zipkv/replica_process.log", "zipkv", ZIPKV_RATIO, ONE_MACHINE_STEPS),
    "zipkv_uncompressed": LogSource(
        ONE_MACHINE, "w0/zipkv_uncompressed/replica_process.log", "zipkv_uncompressed", 1.0, ONE_MACHINE_STEPS
    ),
    "zipkv_triton_prefill": LogSource(
        "serving_goodput_balanced_records.tgz",
        "./zipkv_triton_prefill/replica_process.log",
        "zipkv_balanced_splits_triton_prefill",
        ZIPKV_RATIO,
    ),
}


def fit_decode_line(points: list[tuple[int, float]], kv_count_factor: float = 1.0) -> tuple[float, float]:
    """(fixed_ms, ms per raw context token) by least squares over (logged KV tokens, step ms); the logged
    count is raw x kv_count_factor, so the raw slope is the logged one x kv_count_factor."""
    if len(points) < 2:
        raise ValueError("a line needs at least two points")
    fixed, per_100k, _ = line_fit([t for t, _ in points], [ms for _, ms in points])
    return fixed, per_100k / 1e5 * kv_count_factor


def step_model(system: str, fixed_ms: float, ms_per_raw_token: float, prefill: PrefillFit) -> StepModel:
    """The simulation's step model: decode per GB of raw KV, prefill per batch."""
    return StepModel(
        system=system,
        fixed_ms=round(fixed_ms, 3),
        ms_per_kv_gb=round(ms_per_raw_token * 1e9 / KV_BYTES_PER_TOKEN, 4),
        prefill_tokens_per_s=round(1e6 / prefill.ms_per_1k_tokens, 1),
        prefill_ms_per_1k_tokens=prefill.ms_per_1k_tokens,
        prefill_ms_per_1m_pairs=prefill.ms_per_1m_pairs,
    )


def _log_lines(src: LogSource) -> list[str]:
    with tarfile.open(RESULTS / src.archive) as tar:
        f = tar.extractfile(src.member)
        if f is None:
            raise FileNotFoundError(f"{src.member} in {src.archive}")
        return f.read().decode(errors="replace").splitlines()


def fit_all() -> dict[str, Any]:
    """Every system's fit from the logs, as the record holds it."""
    systems: dict[str, Any] = {}
    for name, src in SOURCES.items():
        steps = json.loads((RESULTS / src.decode_steps).read_text())["systems"]
        pts = [(int(p["kv_tokens"]), float(p["step_ms"])) for p in steps[src.decode_key]["points"]]
        fixed, per_tok = fit_decode_line(pts, src.kv_count_factor)
        prefill = fit_prefill(rebuild_batches(parse_lines(_log_lines(src)), CHUNK_TOKENS), round(fixed, 3))
        model = step_model(name, fixed, per_tok, prefill)
        systems[name] = {
            "source": asdict(src),
            "decode": {"points": len(pts), "fixed_ms": model.fixed_ms,
                       "ms_per_100k_raw_tokens": round(per_tok * 1e5, 3), "ms_per_kv_gb": model.ms_per_kv_gb},
            "prefill": asdict(prefill),
            "model": asdict(model),
        }  # fmt: skip
    return {"calibration": NAME, "device": "1 x NVIDIA H100 80GB HBM3", "chunk_tokens": CHUNK_TOKENS,
            "decode_steps": DECODE_STEPS.name, "systems": systems}  # fmt: skip


def models(record: Path = RECORD) -> dict[str, StepModel]:
    """The recorded models (fitted from the logs when there is no record yet)."""
    data = json.loads(record.read_text()) if record.is_file() else fit_all()
    return {name: StepModel(**s["model"]) for name, s in data["systems"].items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.sim.h100_calibration", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=RECORD)
    args = p.parse_args(argv)
    record = fit_all()
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for name, s in record["systems"].items():
        print(name, json.dumps({"decode": s["decode"], "prefill": s["prefill"]}))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
