"""The format study on real KV: ``python -m zipkv.kernels.study``.

Captures K and V from trained models on English prose (kernels/study/models.py: SmolLM2-135M-Instruct, a
RoPE decoder, with K after RoPE as SGLang computes it (``K``, the headline), as transformers computes it
in bf16 (``K_bf16``) and before RoPE (``K_prerope``); MiniLM, an encoder, as a second row), cuts them into
pages of 16 tokens and reports, per layer and over all layers, for K and V: the fraction of values stored
coded and the stored bytes per value, metadata included, for every candidate block geometry with and
without an exact-zero code (kernels/study/blocks.py), and for the real page formats v2 and v3 encoded
through the public codec (kernels/reference/page_codec.py). Writes ``bench/results/format_study.json`` and
prints the tables; docs/format.md records the results and what was chosen from them.
"""

from __future__ import annotations

import argparse
import functools
import json
import operator
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .blocks import FormatCounts, GeometryCounts, measure_candidates, measure_format, zero_fraction
from .models import Capture, capture_decoder, capture_minilm, load_smollm2, text_corpus

__all__ = ["main", "study_capture", "text_corpus"]

FORMAT_VERSIONS = (2, 3)
CACHED_K_STREAMS = ("K", "K_bf16")  # what a KV cache holds: K after RoPE (SGLang's, transformers')


@dataclass(frozen=True)
class GeometryRow:
    """One candidate geometry on one stream of one layer (``layer`` None: all layers)."""

    model: str
    kind: str
    layer: int | None
    stream: str
    counts: GeometryCounts

    def record(self) -> dict[str, object]:
        head = {"model": self.model, "kind": self.kind, "layer": self.layer, "stream": self.stream}
        return head | asdict(self.counts) | self.counts.figures()


@dataclass(frozen=True)
class FormatRow:
    """One page format version on one layer's pages (``layer`` None: all layers), K from ``k_stream``."""

    model: str
    kind: str
    layer: int | None
    k_stream: str
    version: int
    counts: FormatCounts

    def record(self) -> dict[str, object]:
        head = {"model": self.model, "kind": self.kind, "layer": self.layer, "k_stream": self.k_stream,
                "version": self.version}  # fmt: skip
        return head | asdict(self.counts) | self.counts.figures()


@dataclass(frozen=True)
class Study:
    """Everything measured on one captured model."""

    geometries: list[GeometryRow]
    formats: list[FormatRow]
    zero_value_fraction: dict[str, float]  # per stream: values with exponent field 0
    notes: str


def _log(started: float, message: str) -> None:
    print(f"[study {time.time() - started:6.1f} s] {message}", flush=True)


def study_capture(capture: Capture, started: float) -> Study:
    """Every measurement of one captured model: candidate geometries, page formats, exact zeros."""
    layers = sorted({layer for layer, _ in capture.streams})
    streams = sorted({stream for _, stream in capture.streams})
    geometries = []
    for layer in layers:
        for stream in streams:
            for counts in measure_candidates(capture.streams[(layer, stream)]):
                geometries.append(GeometryRow(capture.model, capture.kind, layer, stream, counts))
        if layer % 10 == 9 or layer == layers[-1]:
            _log(started, f"{capture.model}: candidate geometries measured, layers 0..{layer}")
    formats = []
    for k_stream in [s for s in CACHED_K_STREAMS if s in streams]:
        for version in FORMAT_VERSIONS:
            for layer in layers:
                k, v = capture.streams[(layer, k_stream)], capture.streams[(layer, "V")]
                pages = measure_format(k, v, version)
                formats.append(FormatRow(capture.model, capture.kind, layer, k_stream, version, pages))
            _log(started, f"{capture.model}: every page encoded in v{version} (K = {k_stream})")
    zeros = {}
    for stream in streams:
        parts = [capture.streams[(layer, stream)] for layer in layers]
        total = sum(zero_fraction(v) * v.numel() for v in parts) / sum(v.numel() for v in parts)
        zeros[stream] = round(total, 7)
    return Study(geometries, formats, zeros, capture.notes)


def all_layers(rows: list[GeometryRow] | list[FormatRow]) -> list[Any]:
    """Rows summed over layers, one per (model, stream, geometry) or (model, K stream, version)."""
    groups: dict[tuple[object, ...], list[Any]] = {}
    for r in rows:
        key = (r.model, r.stream, r.counts.geometry) if isinstance(r, GeometryRow) else (
            r.model, r.k_stream, r.version)  # fmt: skip
        groups.setdefault(key, []).append(r)
    return [replace(g[0], layer=None, counts=functools.reduce(operator.add, (r.counts for r in g)))
            for g in groups.values()]  # fmt: skip


def print_tables(
    geometries: list[GeometryRow], formats: list[FormatRow], zeros: dict[str, dict[str, float]]
) -> None:
    print("\ncandidate geometries, all layers: values coded (with the exact-zero code), stored B per value")
    for g in geometries:
        f = g.counts.figures()
        print(f"  {g.model:8} {g.stream:10} {g.counts.geometry:7} ({g.counts.values_per_block:3} values) "
              f"{100 * f['coded_fraction']:7.2f}% ({100 * f['coded_fraction_zero_code']:6.2f}%)  "
              f"{f['bytes_per_value']:.4f} B ({f['bytes_per_value_zero_code']:.4f} B)")  # fmt: skip
    print("\npage formats, all layers (kernels/reference/page_codec.py; metadata included):")
    for r in formats:
        f = r.counts.figures()
        print(f"  {r.model:8} K = {r.k_stream:7} v{r.version}: K {100 * f['K_coded_fraction']:6.2f}% coded, "
              f"V {100 * f['V_coded_fraction']:6.2f}%; stored / raw {f['stored_over_raw']:.4f}; "
              f"{r.counts.pages_stored_raw} of {r.counts.pages} pages stored raw")  # fmt: skip
    for model, z in zeros.items():
        print(f"  {model}: values with exponent 0: " + ", ".join(f"{s} {100 * f:.4f}%" for s, f in z.items()))


def to_json(result: dict[str, Any]) -> str:
    """The result as JSON with one row per line (the per-layer rows run to thousands)."""

    def rows(items: list[Any], indent: str) -> str:
        return "[\n" + ",\n".join(indent + " " + json.dumps(r) for r in items) + "\n" + indent + "]"

    parts = []
    for key, value in result.items():
        if isinstance(value, list):
            text = rows(value, " ")
        elif key == "summary":
            inner = [f"  {json.dumps(k)}: {rows(v, '  ')}" for k, v in value.items()]
            text = "{\n" + ",\n".join(inner) + "\n }"
        else:
            text = json.dumps(value)
        parts.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def capture(model: str, args: argparse.Namespace, text: str, started: float) -> Capture:
    _log(started, f"capturing {model} ...")
    if model == "minilm":
        return capture_minilm(text, args.minilm_chunks)
    if model == "smollm2":
        net, tokenize = load_smollm2()
        ids = tokenize(text)[: args.tokens]
        _log(started, f"smollm2 loaded; forward over {len(ids)} tokens")
        return capture_decoder(net, ids, "smollm2")
    raise SystemExit(f"unknown model {model!r}: choose smollm2 or minilm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,minilm", help="comma-separated: smollm2, minilm")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens of text for SmolLM2 (one sequence)")
    parser.add_argument("--minilm-chunks", type=int, default=8, help="512-token chunks of text for MiniLM")
    parser.add_argument("--out", default="bench/results/format_study.json")
    args = parser.parse_args(argv)
    started = time.time()
    text = text_corpus(max_chars=200_000)
    studies = {m: study_capture(capture(m, args, text, started), started) for m in args.models.split(",")}
    geometries = [r for st in studies.values() for r in st.geometries]
    formats = [r for st in studies.values() for r in st.formats]
    zeros = {m: st.zero_value_fraction for m, st in studies.items()}
    summary_geometries, summary_formats = all_layers(geometries), all_layers(formats)
    print_tables(summary_geometries, summary_formats, zeros)
    import transformers

    seconds = round(time.time() - started, 1)
    result = {
        "command": "python -m zipkv.kernels.study " + " ".join(argv or []),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "seconds": seconds,
        "models": {m: st.notes for m, st in studies.items()},
        "zero_value_fraction": zeros,
        "summary": {"geometries": [r.record() for r in summary_geometries],
                    "formats": [r.record() for r in summary_formats]},
        "rows": [r.record() for r in geometries],
        "format_rows": [r.record() for r in formats],
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(to_json(result))
    _log(started, f"wrote {args.out} ({seconds} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
