"""Stored page sizes for the admission benchmark: the format study's measured fractions and the draws.

A page of a format holds ``fmt.blocks_per_page`` blocks, half of them K and half V (v3 at Llama-3.1-8B
shapes: 128 + 128 blocks of 128 values; v2: 32 + 32 of 512). Each K block is stored coded with its layer's
measured K fraction, each V block with the V fraction, independently; the page's stored size is then the
format's own rule, ``PageFormat.compressed_page_bytes`` (v3: a coded page of ``2H * 24D`` bytes plus a
64-byte patch per raw block, or the whole raw page when it has more than ``MAX_PATCHES`` raw blocks).

The fractions are the study's per-layer rows of the real formats (bench/results/format_study.json,
``format_rows``; K with RoPE as SGLang computes it): SmolLM2-135M-Instruct, a trained decoder (30 layers),
and all-MiniLM-L6-v2, an encoder (6 layers), each stretched over the benchmark's 32 layers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Any

import numpy as np

from bench.paths import RESULTS
from zipkv.allocator.plans import EncodePlan
from zipkv.kernels.format.layout import PageFormat

STUDY = RESULTS / "format_study.json"
K_STREAM = "K"  # the study's headline K: after RoPE as SGLang 0.5.17 computes it (fp32, rounded once)
MODEL_KINDS = {"smollm2": "decoder", "minilm": "encoder"}


@dataclass(frozen=True)
class LayerFractions:
    """Measured fraction of blocks stored coded, per layer (stretched to the benchmark's layers)."""

    model: str
    kind: str  # "decoder" or "encoder"
    version: int  # the page format the study encoded
    k: tuple[float, ...]
    v: tuple[float, ...]
    study_layers: int
    source: str

    @property
    def mean(self) -> float:
        return float(np.mean(self.k + self.v))


def load_study(path: Path = STUDY) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except OSError as exc:
        hint = "run `python -m zipkv.kernels.study` to write it"
        raise SystemExit(f"{path} unreadable ({exc}); {hint}") from exc


def study_fractions(study: dict[str, Any], model: str, version: int, layers: int) -> LayerFractions:
    """The study's per-layer K and V coded fractions of ``model`` at format ``version``, over ``layers``."""
    rows = [
        r
        for r in study["format_rows"]
        if r["model"] == model and r["version"] == version and r["k_stream"] == K_STREAM
    ]
    if not rows:
        raise SystemExit(
            f"format study has no v{version} rows for {model} (K stream {K_STREAM}); "
            "re-run `python -m zipkv.kernels.study`"
        )
    rows.sort(key=lambda r: int(r["layer"]))
    k = [float(r["K_coded_fraction"]) for r in rows]
    v = [float(r["V_coded_fraction"]) for r in rows]
    n = len(rows)
    return LayerFractions(
        model=model,
        kind=MODEL_KINDS.get(model, "unknown"),
        version=version,
        k=tuple(k[layer * n // layers] for layer in range(layers)),
        v=tuple(v[layer * n // layers] for layer in range(layers)),
        study_layers=n,
        source=f"{STUDY.name} format_rows ({model}, v{version}, K stream {K_STREAM!r} and V, {n} layers)",
    )


def page_bytes_table(fmt: PageFormat) -> np.ndarray:
    """Stored bytes of a page by its number of raw blocks, ``0 .. blocks_per_page`` (metadata apart)."""
    n = fmt.blocks_per_page
    return np.array([fmt.compressed_page_bytes(n - raw) for raw in range(n + 1)], dtype=np.int64)


def size_model(
    fmt: PageFormat, k: list[float] | tuple[float, ...], v: list[float] | tuple[float, ...], seed: int
) -> Callable[[EncodePlan], np.ndarray]:
    """Stored bytes of each (layer, page) of a plan: raw K and V blocks drawn from the layer's fractions."""
    rng = np.random.default_rng(seed)
    raw_k, raw_v = 1 - np.asarray(k), 1 - np.asarray(v)
    half = fmt.blocks_per_page // 2  # K's page-heads, then V's: the same number of blocks each
    table = page_bytes_table(fmt)

    def sizes(plan: EncodePlan) -> np.ndarray:
        raw = rng.binomial(half, raw_k[plan.layers]) + rng.binomial(half, raw_v[plan.layers])
        return table[raw]

    return sizes


def _binomial_pmf(n: int, p: float) -> np.ndarray:
    return np.array([comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)])


def expected_page_bytes(fmt: PageFormat, k_fraction: float, v_fraction: float) -> float:
    """Mean stored bytes of a page under the draws of ``size_model`` (exact, raw-page rule included)."""
    half = fmt.blocks_per_page // 2
    raw = np.convolve(_binomial_pmf(half, 1 - k_fraction), _binomial_pmf(half, 1 - v_fraction))
    return float(raw @ page_bytes_table(fmt))
