"""The Hopper decode kernel's benchmark (bench/kernels/bench_decode_hopper.py's JSON) as a picture: per
batch x context, each implementation's speed against FlashInfer's (time of FlashInfer / time of it), with the
stored-byte read floor as the ceiling the compressed kernel could reach; and its --timing records as
per-SM timelines. Used by bench/plots.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

# (row field, label, colour): the times each benchmark row holds
SERIES = (
    ("zipkv_us", "zipkv Hopper kernel, v3 pages", "#d62728"),
    ("zipkv_32_2_4_us", "zipkv Hopper kernel, v3 pages, one split count per request (max 4)", "#9467bd"),
    ("zipkv_32_2_4_0_2_0_0_0_us", "zipkv Hopper kernel, v3 pages, the default tile, 4 per SM", "#2ca02c"),
    ("zipkv_32_2_4_0_2_0_0_1_0_1_us", "zipkv Hopper kernel, v3 pages, even shares, 4 per SM", "#e377c2"),
    ("zipkv_32_2_6_168_2_0_0_1_0_1_us", "zipkv Hopper kernel, v3 pages, even shares, 6 per SM", "#8c564b"),
    ("zipkv_raw_pages_us", "zipkv Hopper kernel, raw pages", "#ff9896"),
    ("read_floor_stored_us", "read floor of the stored bytes", "#7f7f7f"),
)
BASELINE = "flashinfer_tc_us"
SPEED_CAP = 2.0  # bars past this are drawn to it and labelled (one FlashInfer outlier would flatten the rest)


def speed_rows(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, float]]]:
    """(shape label, {series label: FlashInfer time / its time}) per row, in the rows' order."""
    out = []
    for r in rows:
        base = r.get(BASELINE)
        if not base:
            continue
        speeds = {label: base / r[key] for key, label, _ in SERIES if r.get(key)}
        out.append((shape_label(r), speeds))
    return out


def shape_label(row: dict[str, Any]) -> str:
    """``batch x context`` for a uniform batch; a skewed one (``1x87040+17x6400``: ``ctx`` is the longest)
    by its requests, longest request and total KV tokens."""
    if row["batch"] * row["ctx"] == row.get("kv_tokens", row["batch"] * row["ctx"]):
        return f"{row['batch']} x {row['ctx']}"
    return f"{row['batch']} reqs, longest {row['ctx'] // 1000}k,\n{row['kv_tokens'] // 1000}k tokens"


def hopper_figure(data: dict[str, Any], first_label: str | None = None) -> Figure:
    """``first_label``: what the run's first config (``zipkv_us``) was, where it was not the default."""
    shapes = speed_rows(data["rows"])
    series = [s for s in SERIES if any(s[1] in speeds for _, speeds in shapes)]  # those this run timed
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / len(series)
    for i, (key, label, color) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(shapes))]
        speeds = [s.get(label, 0.0) for _, s in shapes]
        shown = first_label if first_label and key == "zipkv_us" else label
        ax.bar(xs, [min(v, SPEED_CAP) for v in speeds], width, label=shown, color=color)
        for x, v in zip(xs, speeds, strict=True):
            if v > SPEED_CAP:
                ax.annotate(f"{v:.1f}x", (x, SPEED_CAP), ha="center", va="bottom", fontsize=7, rotation=90)
    ax.axhline(1.0, color="#1f77b4", lw=1.5, label="FlashInfer (tensor cores), raw pages")
    ax.set_ylim(0, SPEED_CAP * 1.15)
    ax.set_xticks(range(len(shapes)), [name for name, _ in shapes], fontsize=8)
    ax.set_xlabel("batch x context (tokens)")
    ax.set_ylabel("speed relative to FlashInfer")
    ax.set_title(f"Decode attention on page format v3: {data.get('device', '')}, {data.get('date', '')[:10]}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def timeline_figure(doc: dict[str, Any], batch: int = 32, ctx: int = 8192) -> Figure:
    """One launch's programs as bars per SM (bench_decode_hopper.py --timing's raw stamps): when each
    program ran, and how much of it was waiting for its first tile. Uneven SM finish times are the loss."""
    row = next(r for r in doc["timing"] if r["batch"] == batch and r["ctx"] == ctx)
    fig, ax = plt.subplots(figsize=(10, 5.5))
    _draw_timeline(ax, row)
    ax.set_title(
        f"Hopper decode kernel, {batch} x {ctx}: {row['programs']} programs of {row['tiles_per_program']} "
        f"tiles, span {row['span_us']:.0f} us ({doc.get('date', '')[:10]})"
    )
    fig.tight_layout()
    return fig


def even_shares_timeline_figure(doc: dict[str, Any], batch: int, ctx: int) -> Figure:
    """The plan's own launch above even shares (--timing-even), same axes: the plan's idle slots against
    even shares' full ones, and where each launch's SMs finish."""
    rows = [r for r in doc["timing"] if r["batch"] == batch and r["ctx"] == ctx]
    fig, axes = plt.subplots(2, 1, figsize=(10, 9), sharex=True)
    for ax, row in zip(axes, sorted(rows, key=lambda r: bool(r.get("even_shares"))), strict=True):
        _draw_timeline(ax, row)
        what = "even shares" if row.get("even_shares") else "the plan's own launch (one item a program)"
        ax.set_title(f"{what}: span {row['span_us']:.0f} us, call {row['call_us']:.0f} us", fontsize=10)
    when = doc.get("date", "")[:10]
    fig.suptitle(f"Hopper decode kernel, {batch} x {ctx}, {doc.get('device', '')} ({when})")
    fig.tight_layout()
    return fig


def _draw_timeline(ax: Any, row: dict[str, Any]) -> None:
    slots: dict[int, list[float]] = {}  # SM -> end time of each bar lane
    for start, first, end, sm, *_ in sorted(row["stamps_ns"]):  # (later records: a second item too)
        first = first if first >= start else end  # an idle program (no request) never lands a tile
        lanes = slots.setdefault(sm, [])
        lane = next((i for i, t in enumerate(lanes) if t <= start), len(lanes))
        if lane == len(lanes):
            lanes.append(0.0)
        lanes[lane] = end
        y = sm + lane / 4
        ax.plot([start / 1e3, first / 1e3], [y, y], color="#ff9896", lw=1.2, solid_capstyle="butt")
        ax.plot([first / 1e3, end / 1e3], [y, y], color="#d62728", lw=1.2, solid_capstyle="butt")
    ax.plot([], [], color="#ff9896", label="waiting for its first tile")
    ax.plot([], [], color="#d62728", label="streaming tiles")
    ax.set_xlabel("time since the first program started (us)")
    ax.set_ylabel("SM (a bar per resident program)")
    ax.legend(loc="lower left", fontsize=8)


def timeline_figures(results: Path) -> list[tuple[str, Figure]]:
    """(name, picture) of the committed timing records: decode_hopper_timing.json (32 x 8192, H200), and the
    plan's launch against even shares at 59 x 8448 (H100) before and after the merge reshape and the shorter
    program start (decode_hopper_even_shares_timing_h100.json, decode_hopper_prologue_merge_h100.json)."""
    figures = []
    if (results / "decode_hopper_timing.json").is_file():
        doc = json.loads((results / "decode_hopper_timing.json").read_text())
        figures.append(("decode_hopper_timeline", timeline_figure(doc)))
    for record, name in (
        ("decode_hopper_even_shares_timing_h100.json", "decode_hopper_even_shares_timeline_h100"),
        ("decode_hopper_prologue_merge_h100.json", "decode_hopper_prologue_merge_timeline_h100"),
    ):
        if (results / record).is_file():
            doc = json.loads((results / record).read_text())
            figures.append((name, even_shares_timeline_figure(doc, 59, 8448)))
    return figures
