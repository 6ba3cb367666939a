"""Reads ``ncu --csv --page raw`` on stdin and prints the metrics the kernel analysis in docs/benchmarks.md
uses (instructions, shared loads/stores, DRAM throughput, stall reasons per issued instruction) as JSON."""

from __future__ import annotations

import argparse
import csv
import json
import sys

KEEP = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum.per_second",
    "smsp__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__warps_active.avg.per_cycle_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__sass_inst_executed_op_shared_st.sum",
    "smsp__sass_inst_executed_op_shared_ld.sum",
    "smsp__sass_inst_executed_op_ldgsts.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "launch__registers_per_thread",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    # L2 and the SM's occupancy: on the H200 the L2 ran at 87% of its peak beside DRAM at 77% (32 x 8192),
    # and which L2 unit that is (tag lookups, data sectors, the crossbar) decides whether L2 caps the kernel
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sectors.avg.pct_of_peak_sustained_elapsed",
    "lts__t_requests.sum",
    "lts__t_sectors.sum",
    "lts__d_sectors.avg.pct_of_peak_sustained_elapsed",
    "lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed",
    "lts__xbar2lts_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__cycles_elapsed.avg.per_second",
)


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()  # no options: --help says what it reads
    rows = list(csv.reader(sys.stdin))
    if len(rows) < 3:
        print(json.dumps({"error": "no ncu rows"}))
        return
    head, units, vals = rows[0], rows[1], rows[2:]
    out = []
    for v in vals:
        rec = {
            h: f"{x} {u}".strip()
            for h, u, x in zip(head, units, v, strict=False)
            if h in KEEP
            or (h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("per_issue_active.ratio"))
        }
        rec["kernel"] = v[head.index("Kernel Name")] if "Kernel Name" in head else "?"
        out.append(rec)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
