"""bench/kernels/tma_probe.py, compiled by .cache/gluon-venv's Triton 3.6.0 (no GPU): the facts
docs/benchmarks.md draws from it about TMA copies for the Hopper decode kernel."""

from __future__ import annotations

import json

from gluon_venv import run_module


def test_a_coded_page_head_needs_two_boxes_and_each_copy_costs_a_cta_barrier() -> None:
    out = run_module("bench.kernels.tma_probe", "--rows", "8,16,24", "--json", timeout_s=300)
    rows = {r["rows"]: r for r in json.loads(out)}
    # 24 rows of 128 bytes (a coded page-head at head_dim 128) is not a box: 16 + 8
    assert rows[24]["compiles"] is False and "power of 2" in rows[24]["error"], rows[24]
    one, two = rows[16], rows[8]
    assert one["UTMALDG"] == 1 and two["UTMALDG"] == 2 and one["LDSM"] > 0, (one, two)
    # outside a warp-specialized partition every copy is fenced by CTA barriers of its own
    assert one["BAR"] >= 2 and two["BAR"] > one["BAR"], (one, two)
    assert two["loop_instructions"] > one["loop_instructions"], (one, two)
