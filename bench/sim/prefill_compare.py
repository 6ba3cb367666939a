"""Prefill cost, system against system, on the same batches: measured gaps and every fitted model on each set.

    python -m bench.sim.prefill_compare    # -> bench/results/serving_prefill_compare.json

A fitted prefill model (bench/sim/prefill_log.py) splits a batch's time into a per-token part and an
attention part (per (new, context) token pair). The two parts are nearly collinear on the trace, so one
system's larger per-token cost next to a smaller attention slope does not say its prefill is slower. What
does: the time each model gives to one and the same set of batches. Here every system's back-to-back
prefill batches from each trace window (the record archive of the one-machine run) are summed as measured
(their own gaps), and priced by every system's fitted model (bench/results/sim_calibration_h100_serving_logs
.json, fitted on window 0). Each row: whose batches, their count and new tokens, measured ms and ms per 1k
tokens, and the ms each model predicts for them; `vs_sglang` is each model's total over SGLang's model's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.sim.h100_calibration import CHUNK_TOKENS, ONE_MACHINE, RECORD
from bench.sim.prefill_log import PrefillBatch, PrefillFit, back_to_back, parse_lines

OUT = RESULTS / "serving_prefill_compare.json"
LOGS = {  # system -> its server's log in a window's folder of the archive
    "sglang": "sglang_gateway/sglang_server.log",
    "zipkv": "zipkv/replica_process.log",
    "zipkv_uncompressed": "zipkv_uncompressed/replica_process.log",
}
WINDOWS = ("w0", "w32")


def priced(batches: list[PrefillBatch], fits: dict[str, PrefillFit]) -> dict[str, Any]:
    """One row: the batches as measured and as each fit prices them."""
    tokens = sum(b.new_tokens for b in batches)
    measured = sum(b.gap_ms for b in batches)
    model_ms = {name: round(sum(f.batch_ms(b.seqs) for b in batches), 1) for name, f in fits.items()}
    base = model_ms.get("sglang")
    return {
        "batches": len(batches),
        "new_tokens": tokens,
        "measured_ms": round(measured, 1),
        "measured_ms_per_1k_tokens": round(1e3 * measured / tokens, 3) if tokens else None,
        "model_ms": model_ms,
        "vs_sglang": {n: round(ms / base, 4) for n, ms in model_ms.items()} if base else None,
    }


def compare(archive: Path, record: Path) -> dict[str, Any]:
    systems = json.loads(record.read_text())["systems"]
    fits = {name: PrefillFit(**systems[name]["prefill"]) for name in LOGS}
    rows = []
    with tarfile.open(archive) as tar:
        for window in WINDOWS:
            for system, member in LOGS.items():
                f = tar.extractfile(f"{window}/{member}")
                if f is None:
                    raise FileNotFoundError(f"{window}/{member} in {archive}")
                lines = f.read().decode(errors="replace").splitlines()
                row = priced(back_to_back(parse_lines(lines), CHUNK_TOKENS), fits)
                rows.append({"window": window, "batches_of": system} | row)
    return {"archive": archive.name, "fits": record.name, "chunk_tokens": CHUNK_TOKENS, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.sim.prefill_compare", description=__doc__.split("\n")[0]
    )
    p.add_argument("--archive", type=Path, default=RESULTS / ONE_MACHINE)
    p.add_argument("--fits", type=Path, default=RECORD)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    missing = [str(f) for f in (args.archive, args.fits) if not f.is_file()]
    if missing:
        raise SystemExit(
            f"prefill_compare: no such file: {', '.join(missing)} (--archive: a serving run's record archive "
            "with w0/ and w32/; --fits: python -m bench.sim.h100_calibration's record)"
        )
    out = compare(args.archive, args.fits)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for r in out["rows"]:
        print(r["window"], r["batches_of"], r["measured_ms_per_1k_tokens"], r["vs_sglang"])
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
