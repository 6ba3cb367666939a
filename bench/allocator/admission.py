"""Equal-memory admission: the most requests that run at once, with and without compression and the pool.

Llama-3.1-8B KV shapes (32 layers, 8 KV heads, head_dim 128, pages of 16 tokens) and the KV budget of the
ZipFusion H100 setup: what uncompressed SGLang holds for 46 requests of 8192 prompt + 256 output tokens.
Each request reserves its whole length at raw size (528 pages), prefills 512 pages, which fill and are
compressed, and is admitted only while ``headroom_pages()`` covers the next request's 528 pages. Then every
admitted request decodes its 256 tokens (pages fill and compress online) to prove the admission was safe.

Page formats v3 and v2 side by side (``--format-versions``), each with its own block model and the pool's
unit for it (``unit_bytes_for``: 64 B for v3, 256 B for v2). Stored page sizes are drawn block by block from
the format study's measured per-layer fractions of that format (bench/allocator/admission_sizes.py):
SmolLM2-135M-Instruct's KV (a trained decoder, K after RoPE as SGLang computes it) is the headline;
all-MiniLM-L6-v2 (an encoder) is a secondary row. The compressed runs pay for the ``page_meta`` table out of
the same budget.
The bookkeeping is the allocator's real host ledger (``zipkv.allocator.Ledger``); only the encoder's output
sizes are drawn, not computed.

    python -m bench.allocator.admission            # writes bench/results/admission.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.allocator.admission_sizes import (
    LayerFractions,
    expected_page_bytes,
    load_study,
    size_model,
    study_fractions,
)
from bench.paths import RESULTS
from zipkv.allocator import Ledger, LedgerConfig
from zipkv.allocator.plans import CompletedFence, EncodePlan, PageState
from zipkv.allocator.pool import unit_bytes_for
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat

LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128
PROMPT_TOKENS, OUTPUT_TOKENS, BASELINE_REQUESTS = 8192, 256, 46
CHUNK_BYTES = 2 << 20
FMT = PageFormat(HEAD_DIM, KV_HEADS)  # the default format (bench/allocator/allocator_step.py)
DEFAULT_VERSIONS = (3, 2)
DECODER, ENCODER = "smollm2", "minilm"


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(x.split(":", 1)[1].strip() for x in lines if x.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def kv_budget_bytes() -> int:
    """What uncompressed SGLang holds for 46 requests of 8192 + 256 tokens (all layers, K and V)."""
    bytes_per_token = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2
    return BASELINE_REQUESTS * (PROMPT_TOKENS + OUTPUT_TOKENS) * bytes_per_token


def make_ledger(budget_bytes: int, compression: bool, shared_pool: bool, fmt: PageFormat = FMT) -> Ledger:
    max_pages = budget_bytes // (LAYERS * fmt.min_page_bytes)
    if compression:  # equal memory: the per-page metadata table comes out of the same budget
        budget_bytes -= LAYERS * max_pages * fmt.meta_bytes_per_page
    unit = unit_bytes_for(fmt)
    cfg = LedgerConfig(
        num_layers=LAYERS,
        num_chunks=budget_bytes // CHUNK_BYTES,
        chunk_units=CHUNK_BYTES // unit,
        raw_page_units=fmt.raw_page_bytes // unit,
        max_pages=max_pages,
        shared_pool=shared_pool,
        compression=compression,
        unit_bytes=unit,
    )
    return Ledger(cfg)


def end_step(led: Ledger, sizes: Callable[[EncodePlan], np.ndarray]) -> None:
    """What PagePool.end_step does, with the encoder's sizes drawn (CPU: launches finish at once)."""
    led.poll()
    plan = led.plan_encode()
    if plan is not None:
        stored = sizes(plan)
        led.launched(plan, CompletedFence(), lambda: stored)
    move = led.plan_compaction()
    if move is not None:
        led.moved(move)
    led.poll()


def admit_and_decode(led: Ledger, sizes: Callable[[EncodePlan], np.ndarray]) -> int:
    """Admit while the next request fits, then decode every admitted one to its full length; the count."""
    prompt_pages = PROMPT_TOKENS // PAGE_TOKENS
    max_pages = (PROMPT_TOKENS + OUTPUT_TOKENS) // PAGE_TOKENS
    pages: dict[str, list[int]] = {}
    while led.headroom_pages() >= max_pages:
        rid = f"r{len(pages)}"
        led.reserve(rid, max_pages)
        ids, _ = led.allocate(prompt_pages, rid)
        pages[rid] = ids.tolist()
        led.mark_full(ids)
        while led.full_queue:  # compress the prompt, as many pages per launch as there is room for
            end_step(led, sizes)
    admitted = len(pages)
    for token in range(PROMPT_TOKENS, PROMPT_TOKENS + OUTPUT_TOKENS):  # decode: raises if memory runs out
        if token % PAGE_TOKENS == 0:
            ids, _ = led.allocate(admitted, list(pages))
            for rid, page in zip(pages, ids.tolist(), strict=True):
                pages[rid].append(page)
        if token % PAGE_TOKENS == PAGE_TOKENS - 1:
            led.mark_full([p[-1] for p in pages.values()])
        end_step(led, sizes)
    return admitted


def fluid_ideal_requests(fmt: PageFormat, fractions: LayerFractions | None, led: Ledger) -> float:
    """Requests the ledger's chunks hold if bytes were fluid: prompt pages at their mean stored size, the
    decode pages raw; per layer (no pool: the tightest layer bounds it) or over all layers (the pool)."""
    prompt_pages = PROMPT_TOKENS // PAGE_TOKENS
    output_pages = OUTPUT_TOKENS // PAGE_TOKENS
    raw_page = float(fmt.raw_page_bytes)
    page = [raw_page] * LAYERS
    if fractions is not None:
        page = [expected_page_bytes(fmt, k, v) for k, v in zip(fractions.k, fractions.v, strict=True)]
    per_layer = max(page) if not led.cfg.shared_pool else float(np.mean(page))
    budget = led.cfg.num_chunks * CHUNK_BYTES
    return budget / (LAYERS * (prompt_pages * per_layer + output_pages * raw_page))


def simulate(
    fmt: PageFormat, fractions: LayerFractions | None, shared_pool: bool, seed: int = 0
) -> dict[str, object]:
    """One run: compression off when ``fractions`` is None, else pages drawn at those fractions."""
    compression = fractions is not None
    led = make_ledger(kv_budget_bytes(), compression, shared_pool, fmt)
    sizes = size_model(fmt, fractions.k, fractions.v, seed) if fractions is not None else _no_sizes
    admitted = admit_and_decode(led, sizes)
    compressed = led.page_units[:, led.page_state == PageState.COMPRESSED]
    row: dict[str, object] = {
        "format_version": fmt.version,
        "compression": compression,
        "shared_pool": shared_pool,
        "max_concurrent_requests": admitted,
        "ran_to_max_length": True,  # admit_and_decode raises OutOfPages otherwise
        "fluid_ideal_requests": round(fluid_ideal_requests(fmt, fractions, led), 2),
        "chunks": led.cfg.num_chunks,
    }
    if compressed.size:
        unit = led.cfg.unit_bytes
        raw_bytes = compressed.size * fmt.raw_page_bytes
        row["stored_over_raw_bytes"] = round(float(compressed.sum()) * unit / raw_bytes, 4)
        meta = compressed.size * fmt.meta_bytes_per_page
        row["stored_over_raw_bytes_with_meta"] = round((float(compressed.sum()) * unit + meta) / raw_bytes, 4)
        row["pages_stored_raw"] = int((compressed == led.raw).sum())
    return row


def _no_sizes(plan: EncodePlan) -> np.ndarray:
    raise AssertionError("nothing is encoded with compression off")


def fraction_models(study: dict[str, Any], version: int) -> list[tuple[str, LayerFractions]]:
    """The per-layer fractions a format is run at: the decoder's (measured, and its mean on every layer),
    the encoder's, and an illustrative skew."""
    decoder = study_fractions(study, DECODER, version, LAYERS)
    uniform_k, uniform_v = (float(np.mean(decoder.k)),) * LAYERS, (float(np.mean(decoder.v)),) * LAYERS
    # "skewed" is illustrative, not measured: even layers at the decoder's mean, odd layers at half of it,
    # to show what the shared pool does when layers differ much more than the measured ones do.
    skew = tuple(decoder.mean / (1 + layer % 2) for layer in range(LAYERS))
    return [
        (f"{DECODER}_per_layer", decoder),
        (f"{DECODER}_uniform", replace(decoder, k=uniform_k, v=uniform_v)),
        (f"{ENCODER}_per_layer_encoder", study_fractions(study, ENCODER, version, LAYERS)),
        ("skewed_illustrative", replace(decoder, k=skew, v=skew)),
    ]


def run_format(study: dict[str, Any], version: int) -> tuple[list[dict[str, object]], dict[str, object]]:
    """Every row of one page format, and what the record says about its fractions."""
    fmt = PageFormat(HEAD_DIM, KV_HEADS, version=version)
    rows: list[dict[str, object]] = []
    models: list[tuple[str, LayerFractions | None]] = [("none", None), *fraction_models(study, version)]
    for name, fractions in models:
        for shared_pool in (False, True):
            row = {"layer_fractions": name, **simulate(fmt, fractions, shared_pool)}
            if fractions is not None:
                row["model_kind"] = fractions.kind
                row["coded_fraction_k"] = round(float(np.mean(fractions.k)), 4)
                row["coded_fraction_v"] = round(float(np.mean(fractions.v)), 4)
            rows.append(row)
            print(
                f"  v{version} {name:28s} shared_pool={shared_pool!s:5s} -> {row['max_concurrent_requests']} "
                f"requests (fluid ideal {row['fluid_ideal_requests']})",
                file=sys.stderr,
                flush=True,
            )
    described = {
        "unit_bytes": unit_bytes_for(fmt),
        "block_values": fmt.block_values,
        "blocks_per_page": fmt.blocks_per_page,
        "raw_page_bytes": fmt.raw_page_bytes,
        "all_coded_page_bytes": fmt.min_page_bytes,
        "meta_bytes_per_page": fmt.meta_bytes_per_page,
        "fractions": {
            name: {"source": f.source, "k": [round(x, 4) for x in f.k], "v": [round(x, 4) for x in f.v]}
            for name, f in models
            if f is not None and not name.startswith(("skewed", f"{DECODER}_uniform"))
        },
    }
    return rows, described


def print_table(rows: list[dict[str, object]]) -> None:
    print("| format | layer fractions | shared pool | coded K / V | stored/raw (meta incl.) | max concurrent "
          "requests | fluid ideal |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        coded = f"{r['coded_fraction_k']} / {r['coded_fraction_v']}" if r["compression"] else "-"
        stored = r.get("stored_over_raw_bytes_with_meta", "-")
        print(
            f"| v{r['format_version']} | {r['layer_fractions']} | {r['shared_pool']} | {coded} | {stored} | "
            f"{r['max_concurrent_requests']} | {r['fluid_ideal_requests']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "admission.json")
    parser.add_argument("--format-versions", type=int, nargs="+", choices=(2, 3), default=DEFAULT_VERSIONS)
    args = parser.parse_args()
    study = load_study()
    start = time.perf_counter()
    rows: list[dict[str, object]] = []
    formats: dict[str, object] = {}
    for version in args.format_versions:
        version_rows, formats[f"v{version}"] = run_format(study, version)
        rows += version_rows
    result = {
        "command": "python -m bench.allocator.admission",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{cpu_name()} ({os.cpu_count()} cores, shared with other work; load average "
        f"{os.getloadavg()[0]:.1f}), Python {platform.python_version()}, numpy {np.__version__}",
        "model_shapes": {
            "layers": LAYERS,
            "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "page_tokens": PAGE_TOKENS,
        },
        "request": {"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS},
        "kv_budget_bytes": kv_budget_bytes(),
        "chunk_bytes": CHUNK_BYTES,
        "formats": formats,
        "paper": {"uncompressed": 46, "compressed": 57},
        "seconds": round(time.perf_counter() - start, 1),
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(rows)


if __name__ == "__main__":
    main()
