"""The SASS lines that cost the most in an Nsight Compute report: stall samples and excess shared-memory
wavefronts per instruction, from ``ncu --import R --page source --csv --print-source sass``.

Reads the CSV on stdin and prints JSON: the report's totals per metric, and the top lines by each of
``RANKED`` (columns are matched by a part of their name, since Nsight Compute versions name them slightly
differently), each with its address, SASS text and every ranked metric. Also groups the stall samples by
opcode, which says what kind of work the samples sit on (shared loads, MMA, integer ALU, ...).

    ncu --import hopper.ncu-rep --page source --csv --print-source sass | python -m bench.kernels.ncu_source
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Iterable
from typing import Any

# (key, a part of the column's name)
RANKED = (
    ("stall_samples", "Warp Stall Sampling (All"),
    ("shared_excess_wavefronts", "Shared Excessive"),
    ("instructions_executed", "Instructions Executed"),
)


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _column(header: list[str], part: str) -> int | None:
    return next((i for i, h in enumerate(header) if part.lower() in h.lower()), None)


def summarize(rows: Iterable[list[str]], top: int = 15) -> dict[str, Any]:
    it = iter(rows)
    header = next((r for r in it if any("Source" in c for c in r)), None)
    if header is None:
        return {"error": "no source-page header in the input (is this ncu --page source --csv output?)"}
    src, addr = _column(header, "Source"), _column(header, "Address")
    cols = {key: _column(header, part) for key, part in RANKED}
    lines: list[dict[str, Any]] = []
    for r in it:
        if src is None or len(r) != len(header):
            continue
        lines.append({
            "address": r[addr] if addr is not None else "",
            "sass": r[src].strip(),
            **{k: _number(r[i]) for k, i in cols.items() if i is not None},
        })  # fmt: skip
    found = {k: i for k, i in cols.items() if i is not None}
    out: dict[str, Any] = {"lines": len(lines), "columns": {k: header[i] for k, i in found.items()}}
    out["totals"] = {k: sum(line.get(k, 0.0) for line in lines) for k in found}
    for key in found:
        out[f"top_by_{key}"] = sorted(lines, key=lambda line: -line.get(key, 0.0))[:top]
    by_op: dict[str, float] = {}
    for line in lines:
        m = re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", str(line["sass"]))
        if m:
            by_op[m.group(1)] = by_op.get(m.group(1), 0.0) + float(line.get("stall_samples", 0.0))
    out["stall_samples_by_opcode"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:25])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=15, help="lines listed per ranked metric")
    a = ap.parse_args()
    print(json.dumps(summarize(csv.reader(sys.stdin), a.top), indent=1))


if __name__ == "__main__":
    main()
