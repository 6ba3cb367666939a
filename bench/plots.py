"""The pictures in the docs, drawn from the committed results: one command, no GPU.

    python -m bench.plots                 # writes docs/img/*.png
    python -m bench.plots --out /tmp/img  # elsewhere

- decode_attention*.png: every bench/results/decode_attention*.json, kernel time against context per
  implementation (one panel per batch size) and speed relative to FlashInfer. Lines are keyed by `impl`
  plus any field a row adds that is not a measurement (format_version, config, ...), so new
  implementations and new variants get their own line without a change here.
- sglang_e2e.png: bench/results/sglang_e2e.json, each workload's systems side by side;
  sglang_e2e_lean_cap_whole.png: the same for the Hopper kernel's current default (H200);
  sglang_e2e_step_profile_59_h100.png: a decode step at the largest batch by kernel group (H100).
- admission.png: bench/results/admission.json (the allocator at Llama-3.1-8B shapes) and
  admission_e2e.json (the reference engine's admission against its KV budget).
- decode_hopper.png, decode_hopper_h100.png: bench/results/decode_hopper.json (H200) and
  decode_hopper_h100.json (H100), the Hopper kernel's speed against FlashInfer's;
  decode_hopper_h100_skewed.png: decode_hopper_h100_skewed.json, skewed batches, balanced splits against one
  split count per request.
- decode_hopper_split_cap_h200.png, decode_hopper_even_shares_h200.png: the lean tile with the split cap, and
  even shares against the plan's own launch (H200).
- decode_hopper_timeline.png: bench/results/decode_hopper_timing.json, one launch's programs per SM;
  decode_hopper_even_shares_timeline_h100.png, decode_hopper_prologue_merge_timeline_h100.png: the plan's
  launch against even shares (H100), before and after the merge reshape and the shorter program start.
- trace_timeline.png: bench/results/trace_cpu.json, one request's spans (bench/serving/trace_capture.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

from bench.paths import RESULTS, ROOT

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.kernels.plot_hopper import hopper_figure, timeline_figures
from bench.serving.plot_step_profile import step_profile_figure
from bench.serving.plot_trace import trace_timeline

# Fields of a decode row that are measurements or the shape, not a variant of the implementation.
MEASURED = {"batch", "context", "median_us", "compressible_fraction", "stored_bytes", "splits", "rel_err"}
REALISTIC = (0.5, 0.999)  # compressible fractions of real KV (docs/format.md: 0.94); 0 and 1 are extremes
BASELINE = "flashinfer_tc"
IMPL_COLORS = {
    "zipkv": "#d62728",
    "zipkv_twin": "#ff9896",
    "flashinfer_tc": "#1f77b4",
    "sglang_triton": "#2ca02c",
    "sdpa_cudnn": "#9467bd",
    "decompress_then_attend": "#8c564b",
    "read_floor": "#7f7f7f",
}
FREE_COLORS = ["#17becf", "#bcbd22", "#e377c2", "#ff7f0e", "#aec7e8", "#98df8a", "#c5b0d5", "#000000"]


def _variant(row: dict[str, Any]) -> str:
    extra = [f"{k}={row[k]}" for k in sorted(row) if k not in MEASURED and k != "impl" and row[k] is not None]
    return " ".join([str(row["impl"]), *extra])


def decode_series(rows: list[dict[str, Any]]) -> dict[str, dict[int, dict[int, float]]]:
    """label -> batch -> context -> median us. Rows on compressed data keep the realistic fraction (an
    implementation measured only at 0 or 1 keeps its highest fraction)."""
    by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if {"impl", "batch", "context", "median_us"} <= row.keys():
            by_label[_variant(row)].append(row)
    out: dict[str, dict[int, dict[int, float]]] = {}
    for label, group in by_label.items():
        fractions = [r.get("compressible_fraction") for r in group]
        if any(f is not None for f in fractions):
            real = [
                r
                for r in group
                if r.get("compressible_fraction") is not None
                and REALISTIC[0] < r["compressible_fraction"] < REALISTIC[1]
            ]
            top = max(f for f in fractions if f is not None)
            group = real or [r for r in group if r.get("compressible_fraction") == top]
            label = f"{label} ({'~94%' if real else f'{top:.0%}'} compressible)" if top > 0 or real else label
        series = out.setdefault(label, {})
        for r in group:
            series.setdefault(int(r["batch"]), {})[int(r["context"])] = float(r["median_us"])
    return out


def line_styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """A colour per line: the known implementations keep theirs across pictures, zipkv drawn heavier;
    new names (and second variants of one implementation) take the next free colour."""
    spare = FREE_COLORS + [matplotlib.colors.to_hex(plt.get_cmap("tab20")(i)) for i in range(20)]
    used: set[str] = set()
    styles = {}
    for i, label in enumerate(labels):
        impl = label.split()[0]
        color = IMPL_COLORS.get(impl, "")
        if not color or color in used:
            color = next((c for c in spare if c not in used), spare[i % len(spare)])
        used.add(color)
        floor = impl == "read_floor"
        styles[label] = {
            "color": color,
            "ls": ":" if floor and "pages=raw" in label else "--" if floor else "-",
            "lw": 2.4 if impl == "zipkv" else 1.3,
            "marker": "o",
            "ms": 3,
        }
    return styles


def decode_figure(data: dict[str, Any], title: str) -> Figure:
    series = decode_series(data.get("rows", []))
    batches = sorted({b for s in series.values() for b in s})
    base = next((s for label, s in series.items() if label.split()[0] == BASELINE), None)
    rows = 2 if base else 1
    styles = line_styles(sorted(series))
    fig, axes = plt.subplots(rows, len(batches), figsize=(3.6 * len(batches), 3.4 * rows), squeeze=False)
    for col, batch in enumerate(batches):
        top = axes[0][col]
        top_ratio = 1.6
        for label in sorted(series):
            points = sorted(series[label].get(batch, {}).items())
            if not points:
                continue
            top.plot(
                *zip(*points, strict=True), label=label.replace(" pages=raw", " (raw pages)"), **styles[label]
            )
            if base and batch in base:
                ratio = [(c, base[batch][c] / us) for c, us in points if c in base[batch]]
                if ratio:
                    axes[1][col].plot(*zip(*ratio, strict=True), **styles[label])
                    top_ratio = max(top_ratio, min(3.0, 1.05 * max(r for _, r in ratio)))
        top.set(title=f"batch {batch}", yscale="log", xlabel="context (tokens)")
        top.set_xscale("log", base=2)
        top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        if base:
            bottom = axes[1][col]
            bottom.axhline(1.0, color="grey", lw=0.8)
            bottom.set(xlabel="context (tokens)", ylim=(0, top_ratio))
            bottom.set_xscale("log", base=2)
    axes[0][0].set_ylabel("time per call (us)")
    if base:
        axes[1][0].set_ylabel("speed vs FlashInfer TC (x)")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: {data.get('device', '')}, {data.get('date', '')}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.02 * (len(labels) // 4), 1, 0.95))
    return fig


def sglang_figure(data: dict[str, Any]) -> Figure:
    metrics = [
        ("max_running_requests", "max running requests"),
        ("decode_tokens_per_s_at_max_batch", "decode tok/s at max batch"),
        ("decode_step_ms", "decode step ms at max batch"),
        ("ttft_s_mean", "mean TTFT (s)"),
    ]
    rows = [r for r in data.get("rows", []) if r.get("rc", 0) == 0]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6))
    width = 0.8 / max(len(systems), 1)
    for ax, (key, name) in zip(axes, metrics, strict=True):
        for i, system in enumerate(systems):
            xs, ys = [], []
            for w, workload in enumerate(workloads):
                match = [r for r in rows if r["system"] == system and r["workload"] == workload]
                if match and match[0].get(key) is not None:
                    xs.append(w + (i - (len(systems) - 1) / 2) * width)
                    ys.append(float(match[0][key]))
            bars = ax.bar(xs, ys, width, label=system)
            ax.bar_label(bars, fmt="%.4g", fontsize=6)
        ax.set_xticks(range(len(workloads)), [w.replace("_", "\n", 1) for w in workloads], fontsize=8)
        ax.set_title(name, fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle(f"SGLang 0.5.17 end to end, equal KV memory: {data.get('device', '')}", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.94))
    return fig


def admission_figure(alloc: dict[str, Any], engine: dict[str, Any] | None) -> Figure:
    fig, axes = plt.subplots(1, 2 if engine else 1, figsize=(11 if engine else 6, 3.8), squeeze=False)
    ax = axes[0][0]
    compressed = [r for r in alloc["rows"] if r.get("compression")]
    groups = list(dict.fromkeys(str(r.get("layer_fractions", "-")) for r in compressed))
    # a bar per page format (when the file has several) and pool kind; uncompressed runs are the baseline
    kinds = list(dict.fromkeys((r.get("format_version"), bool(r.get("shared_pool"))) for r in compressed))
    width = 0.8 / max(len(kinds), 1)
    for i, (version, shared) in enumerate(kinds):
        pts = [
            (g, r["max_concurrent_requests"])
            for g, name in enumerate(groups)
            for r in compressed
            if str(r.get("layer_fractions", "-")) == name
            and (r.get("format_version"), bool(r.get("shared_pool"))) == (version, shared)
        ]
        label = (
            f"format v{version}, " if version is not None else ""
        ) + f"{'shared' if shared else 'per-layer'} pool"
        xs = [g + (i - (len(kinds) - 1) / 2) * width for g, _ in pts]
        ax.bar_label(ax.bar(xs, [n for _, n in pts], width, label=label), fontsize=6)
    for n in sorted({r["max_concurrent_requests"] for r in alloc["rows"] if not r.get("compression")}):
        ax.axhline(n, color="black", ls="--", lw=1, label=f"uncompressed: {n}")
    req = alloc.get("request", {})
    ax.set_xticks(range(len(groups)), [g.replace("_", "\n") for g in groups], fontsize=8)
    ax.set(
        ylabel="requests admitted at once",
        title=f"allocator, Llama-3.1-8B KV, {req.get('prompt_tokens')} + {req.get('output_tokens')} tokens",
    )
    ax.title.set_fontsize(10)
    ax.legend(fontsize=7, loc="lower right")
    if engine:
        ax = axes[0][1]
        for new in sorted({r["max_new_tokens"] for r in engine["rows"]}):
            rows = sorted(
                (r for r in engine["rows"] if r["max_new_tokens"] == new), key=lambda r: r["kv_budget_mib"]
            )
            budgets = [r["kv_budget_mib"] for r in rows]
            for side, style in (("compressed", "-"), ("uncompressed", "--")):
                ax.plot(
                    budgets,
                    [r[side]["max_running"] for r in rows],
                    style,
                    marker="o",
                    label=f"{side}, {new} new tokens",
                )
        ax.set(
            xlabel="KV budget (MiB)",
            ylabel="most requests running at once",
            title="reference engine, tiny model, burst of 32 requests",
        )
        ax.title.set_fontsize(10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def render_all(out: Path, results: Path = RESULTS) -> list[Path]:
    """Draw every picture from the JSON under `results` into `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[str, Figure]] = []
    for path in sorted(results.glob("decode_attention*.json")):
        figures.append((path.stem, decode_figure(json.loads(path.read_text()), path.name)))
    for name in ("sglang_e2e", "sglang_e2e_lean_cap_whole"):
        if (results / f"{name}.json").is_file():
            figures.append((name, sglang_figure(json.loads((results / f"{name}.json").read_text()))))
    if (profile := results / "sglang_e2e_step_profile_59_h100.json").is_file():
        figures.append((profile.stem, step_profile_figure(json.loads(profile.read_text()))))
    if (results / "admission.json").is_file():
        e2e = results / "admission_e2e.json"
        engine = json.loads(e2e.read_text()) if e2e.is_file() else None
        figures.append(
            ("admission", admission_figure(json.loads((results / "admission.json").read_text()), engine))
        )
    for name in ("decode_hopper", "decode_hopper_h100", "decode_hopper_h100_skewed"):
        if (results / f"{name}.json").is_file():
            figures.append((name, hopper_figure(json.loads((results / f"{name}.json").read_text()))))
    cap = results / "decode_hopper_split_cap_h200.json"
    if cap.is_file():
        lean = "zipkv Hopper kernel, v3 pages, the lean tile with the split cap"
        figures.append((cap.stem, hopper_figure(json.loads(cap.read_text()), lean)))
    even = results / "decode_hopper_even_shares_h200.json"
    if even.is_file():
        own = "zipkv Hopper kernel, v3 pages, the plan's own launch (one item a program)"
        figures.append((even.stem, hopper_figure(json.loads(even.read_text()), own)))
    figures.extend(timeline_figures(results))
    if (results / "trace_cpu.json").is_file():
        figures.append(
            ("trace_timeline", trace_timeline(json.loads((results / "trace_cpu.json").read_text())))
        )
    written = []
    for name, fig in figures:
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    for path in render_all(args.out, args.results):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
