"""bench/allocator/admission.py and bench/allocator/admission_sizes.py: the block model of each page format,
the study's fractions, and equal-memory admission on the allocator's real ledger at v3 and v2 (CPU, a few
seconds)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench.allocator.admission import HEAD_DIM, KV_HEADS, LAYERS, kv_budget_bytes, simulate
from bench.allocator.admission_sizes import (
    expected_page_bytes,
    load_study,
    page_bytes_table,
    size_model,
    study_fractions,
)
from zipkv.kernels.format.layout import PageFormat

ROOT = Path(__file__).resolve().parents[2]
V3, V2 = PageFormat(HEAD_DIM, KV_HEADS, version=3), PageFormat(HEAD_DIM, KV_HEADS, version=2)
# v3 at Llama-3.1-8B shapes, from the format's spec (kernels/format/layout_v3.py): 2H page-head records of 24
# D bytes, a 64-byte patch per raw block, the plain raw page past 127 raw blocks or when every block is raw
V3_CODED_PAGE_BYTES, V3_RAW_PAGE_BYTES, PATCH_BYTES = 2 * 8 * 24 * 128, 2 * 8 * 16 * 128 * 2, 64


def _draw(fmt: PageFormat, k: list[float], v: list[float], pages_per_layer: int, seed: int = 1) -> np.ndarray:
    """Sizes of ``pages_per_layer`` pages of every layer in ``k``, as one launch's plan sees them."""
    plan = SimpleNamespace(layers=np.repeat(np.arange(len(k)), pages_per_layer))
    return size_model(fmt, k, v, seed)(plan).reshape(len(k), pages_per_layer)  # type: ignore[arg-type]


def test_v3_page_sizes_are_the_formats_with_its_raw_page_rule() -> None:
    table = page_bytes_table(V3)  # by number of raw blocks
    assert V3.blocks_per_page == table.size - 1 == 256
    assert table[0] == V3_CODED_PAGE_BYTES == 49152
    assert table[1] == V3_CODED_PAGE_BYTES + PATCH_BYTES
    assert table[127] == V3_CODED_PAGE_BYTES + 127 * PATCH_BYTES  # the last page that still patches
    assert (table[128:] == V3_RAW_PAGE_BYTES).all()
    assert not (table % 64).any()  # whole units of the pool's v3 unit


def test_v2_page_sizes_are_768_or_1024_bytes_a_block() -> None:
    table = page_bytes_table(V2)
    raw = np.arange(65)
    assert V2.blocks_per_page == 64 and (table == 768 * (64 - raw) + 1024 * raw).all()


def test_k_and_v_blocks_are_drawn_from_their_own_fractions() -> None:
    # all 128 K blocks raw: every page is past 127 raw blocks and is stored raw, whatever V does
    assert (_draw(V3, [0.0, 1.0], [1.0, 0.0], 500) == V3_RAW_PAGE_BYTES).all()
    # half of V raw, K coded: 64 raw blocks on average, never past 127, so never a raw page
    raw = (_draw(V3, [1.0], [0.5], 4000) - V3_CODED_PAGE_BYTES) / PATCH_BYTES
    assert raw.max() <= 127 and abs(raw.mean() - 64) < 1.0 and 5.0 < raw.std() < 6.3  # Binomial(128, 1/2)
    # half of all 256 raw: about half the pages are past 127 and stored raw
    stored_raw = (_draw(V3, [0.5], [0.5], 4000) == V3_RAW_PAGE_BYTES).mean()
    assert 0.4 < stored_raw < 0.6


def test_each_layer_draws_at_its_own_fraction() -> None:
    sizes = _draw(V2, [1.0, 0.0, 1.0], [1.0, 0.0, 0.5], 200)
    assert (sizes[0] == 64 * 768).all() and (sizes[1] == 64 * 1024).all()
    assert abs((sizes[2] - 64 * 768).mean() / 256 - 16) < 1.0  # 32 V blocks at 1/2 raw: 16 of 256 B more


@pytest.mark.parametrize(("k", "v"), [(0.5, 0.5), (0.9888, 0.9874), (0.7, 0.2)])
def test_the_expected_page_size_is_the_mean_of_the_draws(k: float, v: float) -> None:
    sizes = _draw(V3, [k], [v], 20000)
    assert expected_page_bytes(V3, k, v) == pytest.approx(sizes.mean(), rel=2e-3)


def _smollm2_v3(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The study's SmolLM2 v3 records, K with RoPE as SGLang computes it, in layer order."""
    mine = [r for r in rows if r["model"] == "smollm2" and r["version"] == 3 and r["k_stream"] == "K"]
    return sorted(mine, key=lambda r: int(r["layer"] or 0))  # type: ignore[call-overload]


def test_fractions_are_the_studys_per_layer_rows_stretched_over_the_layers() -> None:
    study = load_study()
    rows = _smollm2_v3(study["format_rows"])
    f = study_fractions(study, "smollm2", 3, LAYERS)
    assert (f.kind, f.study_layers, len(f.k), len(f.v)) == ("decoder", 30, 32, 32)
    assert f.k[0] == rows[0]["K_coded_fraction"] and f.v[31] == rows[29]["V_coded_fraction"]
    assert f.k[16] == rows[15]["K_coded_fraction"]  # 16 * 30 // 32
    # the headline: K with RoPE as SGLang computes it (0.9888), not transformers' bf16 RoPE (0.9413)
    (overall,) = _smollm2_v3(study["summary"]["formats"])
    for kv in ("K", "V"):
        mean = np.mean([r[f"{kv}_coded_fraction"] for r in rows])
        assert mean == pytest.approx(overall[f"{kv}_coded_fraction"], abs=1e-4)
    v2 = study_fractions(study, "smollm2", 2, LAYERS)
    assert np.mean(v2.k) < 0.9 < np.mean(f.k)  # v2's 512-value blocks code fewer of K's values
    encoder = study_fractions(study, "minilm", 3, LAYERS)
    assert (encoder.kind, encoder.study_layers) == ("encoder", 6)
    with pytest.raises(SystemExit, match=r"python -m zipkv\.kernels\.study"):
        study_fractions(study, "smollm2", 1, LAYERS)


def test_decoder_kv_admits_more_at_v3_than_at_v2_and_the_record_is_what_the_bench_gives() -> None:
    study = load_study()
    baseline = simulate(V3, None, shared_pool=True)
    v3 = simulate(V3, study_fractions(study, "smollm2", 3, LAYERS), shared_pool=True)
    v2 = simulate(V2, study_fractions(study, "smollm2", 2, LAYERS), shared_pool=True)
    assert baseline["max_concurrent_requests"] == 46  # what uncompressed SGLang holds in this budget
    assert 46 < v2["max_concurrent_requests"] < v3["max_concurrent_requests"]
    for row in (v3, v2):  # below the fluid ideal, and short of it only by chunk tails and one reservation
        ideal = float(row["fluid_ideal_requests"])  # type: ignore[arg-type]
        assert ideal - 3 <= row["max_concurrent_requests"] <= math.floor(ideal)
    assert v3["stored_over_raw_bytes_with_meta"] == pytest.approx(0.7569, abs=2e-3)  # the study's v3 figure
    assert v3["pages_stored_raw"] == 0
    # equal memory: v3's metadata table (one byte per block: 256 B per page per layer, for as many pages as
    # fit all coded) is paid out of the same budget, in whole 2 MiB chunks
    meta_bytes = LAYERS * (kv_budget_bytes() // (LAYERS * V3_CODED_PAGE_BYTES)) * 256
    assert baseline["chunks"] - v3["chunks"] == math.ceil(meta_bytes / (2 << 20))  # type: ignore[operator]
    record = json.loads((ROOT / "bench/results/admission.json").read_text())
    committed = {
        (r["format_version"], r["layer_fractions"], r["shared_pool"]): r["max_concurrent_requests"]
        for r in record["rows"]
    }
    assert committed[(3, "none", True)] == baseline["max_concurrent_requests"]
    assert committed[(3, "smollm2_per_layer", True)] == v3["max_concurrent_requests"]
    assert committed[(2, "smollm2_per_layer", True)] == v2["max_concurrent_requests"]
    assert record["formats"]["v3"]["unit_bytes"] == 64 and record["formats"]["v2"]["unit_bytes"] == 256
