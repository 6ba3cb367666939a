"""The first GPU run of the Hopper kernel with a producer partition (kernels/attention/hopper/specialized.py):
hopper_cases' producer check over a few of its cases, one line each as it completes, in one process, so a
call can put it under a short timeout before anything else (a wrong mbarrier count shows as a hang, and the
timeout is then the answer, not a lost call).

    python -m bench.kernels.producer_smoke [--cases 0,1,2,4,6] [--out smoke.json]

Exit status 0 when every case is bit-identical on raw pages and to its gather path and within 1e-2 of the
float64 reference; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

from bench.kernels.hopper_cases import CHECKS, _producer_check, check_inputs

# every page raw, partial tiles only, raw blocks and splits, 8 KV heads, group 8 (hopper_cases.CHECKS)
DEFAULT_CASES = "0,1,3,4,5"


def smoke_case(i: int) -> dict[str, object]:
    """Case ``i`` of hopper_cases.CHECKS through the producer kernel, built as check_one builds it."""
    lens, h, d, group, _, _, _, splits = CHECKS[i]
    rec: dict[str, object] = dict(case=i, lens=lens, kv_heads=h, head_dim=d, group=group, max_splits=splits)
    start = time.monotonic()
    try:
        case, q, scale, refo = check_inputs(i)
        rec.update(_producer_check(case, q, scale, splits, refo))
    except Exception as exc:  # the error is the finding: record it and go on to the next case
        rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:1000], tb=traceback.format_exc()[-2000:])
    rec["seconds"] = round(time.monotonic() - start, 1)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="indices into hopper_cases.CHECKS")
    ap.add_argument("--out", default=None, help="JSON of every case's record")
    a = ap.parse_args()
    rows = []
    for i in (int(x) for x in a.cases.split(",")):
        rec = smoke_case(i)
        rows.append(rec)
        print("producer", json.dumps({k: v for k, v in rec.items() if k != "tb"}), flush=True)
    ok = all(bool(r["ok"]) for r in rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), ok=ok, cases=rows), f, indent=1)
    print("producer smoke", "ok" if ok else "FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
