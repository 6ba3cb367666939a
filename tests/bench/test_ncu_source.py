"""bench/kernels/ncu_source.py: the costliest SASS lines of an ncu source page (stalls, bank conflicts)."""

from __future__ import annotations

import csv
import io

from bench.kernels.ncu_source import summarize

HEADER = (
    '"Address","Source","Warp Stall Sampling (All Samples)","L1 Wavefronts Shared Excessive",'
    '"Instructions Executed"'
)
CSV = (
    '"Kernel Name","_decode_hopper_kernel"\n'
    + HEADER
    + """
"0x10","LDS.128 R32, [R172+UR14+0x2000]","120","0","65,536"
"0x20","@!P3 STS.64 [R165+UR14], R36","40","131,072","65,536"
"0x30","HMMA.16816.F32.BF16 R100, R52, R100, RZ","300","0","131,072"
"0x40","HMMA.16816.F32.BF16 R104, R52, R104, RZ","100","0","131,072"
"""
)


def test_top_lines_and_opcodes() -> None:
    s = summarize(csv.reader(io.StringIO(CSV)), top=2)
    assert s["lines"] == 4
    assert s["totals"] == {"stall_samples": 560.0, "shared_excess_wavefronts": 131072.0,
                           "instructions_executed": 393216.0}  # fmt: skip
    assert [x["address"] for x in s["top_by_stall_samples"]] == ["0x30", "0x10"]
    assert s["top_by_shared_excess_wavefronts"][0]["sass"].startswith("@!P3 STS.64")
    assert s["stall_samples_by_opcode"] == {"HMMA": 400.0, "LDS": 120.0, "STS": 40.0}


def test_other_input_is_named() -> None:
    assert "no source-page header" in summarize(csv.reader(io.StringIO("a,b\n1,2\n")))["error"]
