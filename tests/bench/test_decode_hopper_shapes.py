"""bench/kernels/bench_decode_hopper.py's --shapes: uniform batches and skewed ones joined with '+'."""

from __future__ import annotations

from bench.kernels.bench_decode_hopper import parse_shapes


def test_uniform_and_skewed_shapes() -> None:
    assert parse_shapes("2x8192") == [[8192, 8192]]
    assert parse_shapes("1x87040+3x6400,4x16") == [[87040, 6400, 6400, 6400], [16] * 4]
