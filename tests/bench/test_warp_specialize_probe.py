"""bench/kernels/warp_specialize_probe.py, compiled by .cache/gluon-venv's Triton 3.6.0 (no GPU): the facts
docs/benchmarks.md draws from it about a producer warp for the Hopper decode kernel."""

from __future__ import annotations

import json

from gluon_venv import run_module


def test_a_two_warp_program_cannot_take_a_producer_warp_and_a_four_warp_one_can() -> None:
    args = ("--consumers", "2,4", "--maxnreg", "0,128", "--json")
    probed = json.loads(run_module("bench.kernels.warp_specialize_probe", *args, timeout_s=300))
    rows = {(r["consumer_warps"], r["maxnreg"]): r for r in probed}
    for cap in (0, 128):
        refused = rows[(2, cap)]
        assert refused["compiles"] is False and "multiple of 4" in str(refused["error"]), refused
        ok = rows[(4, cap)]
        # the one producer warp is padded to a warpgroup: eight warps a program
        assert ok["compiles"] is True and ok["threads"] == 256, ok
    # Capped at 128 registers a thread (two programs of 256 threads an SM), the consumers are given more
    # than the 199 the kernel holds today and the producer warpgroup far fewer.
    capped = rows[(4, 128)]
    assert max(capped["setmaxnreg_inc"]) > 199 >= 48 >= min(capped["setmaxnreg_dec"]), capped
