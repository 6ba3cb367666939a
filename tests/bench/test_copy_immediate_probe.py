"""bench/kernels/copy_immediate_probe.py, compiled by .cache/gluon-venv's Triton 3.6.0 (no GPU): the range
of a cp.async source's immediate on sm_90, which decides what V's copies cost the Hopper decode kernel
(kernels/attention/hopper/ring.py, docs/benchmarks.md)."""

from __future__ import annotations

import json

from gluon_venv import run_module


def test_a_copy_source_immediate_holds_a_signed_12_bit_offset() -> None:
    out = run_module("bench.kernels.copy_immediate_probe", "--json", timeout_s=300)
    rows = {r["offset"]: r for r in json.loads(out)}
    assert rows[128]["folded"] and rows[2032]["folded"] and rows[-2048]["folded"], rows
    assert not rows[2048]["folded"] and not rows[-2064]["folded"], rows
    # V's lo plane at head_dim 128 and 8 KV heads lies 8 * 24 * 128 bytes past K's: a register of its own
    assert not rows[24576]["folded"], rows
