"""One trace's spans as a timeline (a Gantt chart): one row per span, nested under its parent, coloured by
the service that recorded it, labelled with its duration and its main attributes. Used by bench/plots.py
for bench/results/trace_cpu.json."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

COLORS = {"zipkv-router": "#4C72B0", "zipkv-worker": "#DD8452"}
SHOWN = (
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "zipkv.prefill.tokens",
    "zipkv.prefill.prefix_hit_tokens", "zipkv.decode.steps", "zipkv.admission.reserved_tokens",
)  # fmt: skip
MIN_BAR_MS = 0.4  # spans shorter than this are drawn this wide so they stay visible (the label says how long)


def ordered(spans: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(depth, span) depth first, children by start time."""
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        parent = s["parent_span_id"] if s["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(s)
    out: list[tuple[int, dict[str, Any]]] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: s["start_ns"]):
            out.append((depth, s))
            walk(s["span_id"], depth + 1)

    walk("", 0)
    return out


def trace_timeline(data: dict[str, Any]) -> Figure:
    spans = data["spans"]
    trace_id = max({s["trace_id"] for s in spans}, key=lambda t: sum(s["trace_id"] == t for s in spans))
    rows = ordered([s for s in spans if s["trace_id"] == trace_id])
    t0 = min(s["start_ns"] for _, s in rows)
    end_ms = max(s["end_ns"] - t0 for _, s in rows) / 1e6
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(rows) + 1.4))
    for y, (_, s) in enumerate(rows):
        start, dur = (s["start_ns"] - t0) / 1e6, (s["end_ns"] - s["start_ns"]) / 1e6
        ax.barh(y, max(dur, MIN_BAR_MS), left=start, color=COLORS.get(s["service"], "#55A868"), height=0.6)
        attrs = ", ".join(f"{k.split('.')[-1]} {s['attributes'][k]}" for k in SHOWN if k in s["attributes"])
        text = f"{dur:.2f} ms" + (f"  ({attrs})" if attrs else "")
        inside = dur > 0.45 * end_ms
        ax.text(start + (0.01 * end_ms if inside else max(dur, MIN_BAR_MS) + 0.01 * end_ms), y, text,
                va="center", fontsize=7, color="white" if inside else "black")  # fmt: skip
    # names left-aligned and indented by depth, so the nesting shows
    ax.set_yticks(range(len(rows)), ["    " * d + s["name"] for d, s in rows], fontsize=8, ha="left")
    ax.tick_params(axis="y", pad=170, length=0)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the request reached the router")
    ax.set_xlim(0, end_ms * 1.02)
    handles = [Patch(color=color, label=service) for service, color in COLORS.items()]
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False
    )
    request = data.get("request", {})
    ax.set_title(
        f"one streamed completion ({request.get('max_tokens', '?')} tokens) through the router and a "
        f"reference-engine worker, {data.get('machine', '')}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
