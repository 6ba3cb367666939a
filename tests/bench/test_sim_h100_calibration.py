"""The H100 calibration's pure parts: log parsing, batch rebuilding, the fits, the calibration choice."""

from __future__ import annotations

import pytest

from bench.sim.h100_calibration import fit_decode_line
from bench.sim.prefill_log import (
    PrefillBatch,
    PrefillLine,
    chain_slope,
    fit_prefill,
    parse_lines,
    rebuild_batches,
)
from bench.sim.sim_validation import calibration_for, step_system
from bench.sim.step_model import StepModel

LINE = (
    "[2026-12-05 16:14:29] Prefill batch, #new-seq: {s}, #new-token: {n}, #cached-token: {c}, "
    "token usage: 0.06, #running-req: 1, #queue-req: {q}, #pending-token: {p}, cuda graph: False, "
    "input throughput (token/s): {t}"
)


def line(s: int, n: int, c: int = 0, q: int = 0, p: int = 0, gap_ms: float = 100.0) -> PrefillLine:
    return PrefillLine(s, n, c, q, p, gap_ms, False)


def test_parse_reads_the_fields_and_the_gap_and_marks_decode_between() -> None:
    text = [
        LINE.format(s=2, n=8192, c=1024, q=5, p=7638, t=40960.0),
        "[..] Decode batch, #running-req: 9, #token: 102560, gen throughput (token/s): 35.17, #queue-req: 0",
        LINE.format(s=1, n=4096, c=0, q=0, p=0, t=20480.0),
        "unrelated",
    ]
    got = parse_lines(text)
    assert got == [
        PrefillLine(2, 8192, 1024, 5, 7638, 200.0, False),
        PrefillLine(1, 4096, 0, 0, 0, 200.0, True),
    ]


@pytest.mark.parametrize(
    ("lines", "seqs", "back", "known", "chain"),
    [
        # a prompt alone, then its two further chunks, then its last piece: starts 0, 8192, 16384, 24576
        (
            [line(1, 8192, p=20000), line(1, 8192, p=11808), line(1, 8192, p=3616), line(1, 3616)],
            [((8192, 0),), ((8192, 8192),), ((8192, 16384),), ((3616, 24576),)],
            [False, True, True, True],
            [True] * 4,
            [-1, 0, 0, 0],
        ),
        # the chunked prompt's rest is known from #pending-token (1000 < 8192); the new one starts
        # at its cache
        (
            [line(1, 8192, p=1000), line(2, 5000, c=512)],
            [((8192, 0),), ((1000, 8192), (4000, 512))],
            [False, True],
            [True, True],
            [-1, -1],
        ),
        # others waited (pending >= the batch): the continued share is a guess, so not known, nor
        # its successor
        (
            [line(1, 8192, q=2, p=30000), line(3, 8192, c=1024, q=1, p=20000), line(1, 8192, p=9000)],
            [((8192, 0),), ((2730, 8192), (2731, 512), (2731, 512)), ((8192, 3243),)],
            [False, True, True],
            [True, False, False],
            [-1, -1, 0],
        ),
        # a batch under the chunk budget ends no chain; nothing pending before: the gap is not its own
        (
            [line(1, 4000), line(1, 3000, c=512)],
            [((4000, 0),), ((3000, 512),)],
            [False, False],
            [True, True],
            [-1, -1],
        ),
    ],
)
def test_rebuild_batches(
    lines: list[PrefillLine], seqs: list[tuple[tuple[int, int], ...]], back: list[bool], known: list[bool],
    chain: list[int],
) -> None:  # fmt: skip
    got = rebuild_batches(lines, 8192)
    assert [b.seqs for b in got] == seqs
    assert [b.back_to_back for b in got] == back
    assert [b.known for b in got] == known
    assert [b.chain for b in got] == chain


def _batch(n: int, start: int, chain: int, ms_per_1k: float, ms_per_1m: float, fixed: float) -> PrefillBatch:
    pairs = n * (start + n / 2)
    return PrefillBatch(
        ((n, start),), fixed + ms_per_1k * n / 1e3 + ms_per_1m * pairs / 1e6, True, True, chain
    )


@pytest.mark.parametrize(("ms_per_1k", "ms_per_1m"), [(20.0, 1.5), (25.0, 0.9), (15.0, 4.0)])
def test_the_prefill_fit_recovers_the_costs_it_was_made_from(ms_per_1k: float, ms_per_1m: float) -> None:
    # two chains whose absolute start is offset by an unknown amount: the slope comes from within each
    batches = [_batch(8192, 8192 * k + off, c, ms_per_1k, ms_per_1m, 6.0) for c, off in ((0, 0), (1, 3000))
               for k in range(1, 6)]  # fmt: skip
    batches += [_batch(n, 512, -1, ms_per_1k, ms_per_1m, 6.0) for n in (2048, 4096, 8192)]
    fit = fit_prefill(batches, fixed_ms=6.0)
    assert fit.ms_per_1m_pairs == pytest.approx(ms_per_1m, rel=1e-6)
    assert fit.ms_per_1k_tokens == pytest.approx(ms_per_1k, rel=1e-6)
    assert fit.median_abs_error == pytest.approx(0.0, abs=1e-6)
    assert fit.batch_ms([(8192, 8192)]) == pytest.approx(batches[0].gap_ms)


def test_no_chain_no_attention_slope() -> None:
    with pytest.raises(ValueError, match="no attention slope"):
        chain_slope([_batch(8192, 0, -1, 20.0, 1.0, 5.0)] * 4)


@pytest.mark.parametrize(
    ("points", "factor", "fixed", "per_token"),
    [
        ([(0, 5.0), (100_000, 10.0), (200_000, 15.0)], 1.0, 5.0, 5e-5),
        ([(0, 6.0), (100_000, 11.0)], 0.76, 6.0, 5e-5 * 0.76),  # logged tokens read low: raw slope is less
    ],
)
def test_decode_line(points: list[tuple[int, float]], factor: float, fixed: float, per_token: float) -> None:
    got = fit_decode_line(points, factor)
    assert got == pytest.approx((fixed, per_token))


@pytest.mark.parametrize(
    ("device", "requested", "want"),
    [
        ("1 x NVIDIA H100 80GB HBM3 (driver 580)", "auto", "h100_serving_logs"),
        ("1 x NVIDIA H200", "auto", "h200_e2e"),
        (None, "auto", "h200_e2e"),
        ("1 x NVIDIA H100 80GB HBM3", "h200_e2e", "h200_e2e"),
    ],
)
def test_calibration_for(device: str | None, requested: str, want: str) -> None:
    assert calibration_for(device, requested) == want


def test_a_system_with_its_own_model_uses_it_else_its_prefix() -> None:
    m = StepModel("x", 5.0, 0.3)
    assert (
        step_system("zipkv_triton_prefill", {"zipkv_triton_prefill": m, "zipkv": m}) == "zipkv_triton_prefill"
    )
    assert step_system("zipkv_triton_prefill", {"zipkv": m}) == "zipkv"
    assert step_system("sglang_gateway") == "sglang"


def test_prefill_batch_cost_per_batch_or_per_sequence() -> None:
    old = StepModel("s", 5.0, 0.3, prefill_tokens_per_s=40000.0)
    seqs = [(4096, 0), (4096, 512)]
    assert old.prefill_batch_ms(seqs) == pytest.approx(sum(old.prefill_ms(n, s) for n, s in seqs))
    new = StepModel("s", 5.0, 0.3, prefill_ms_per_1k_tokens=20.0, prefill_ms_per_1m_pairs=2.0)
    pairs = 4096 * 2048 + 4096 * (512 + 2048)
    assert new.prefill_batch_ms(seqs) == pytest.approx(5.0 + 20.0 * 8.192 + 2.0 * pairs / 1e6)
