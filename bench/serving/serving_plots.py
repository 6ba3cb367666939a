"""PNG plots of the serving results (matplotlib, no display): goodput against offered load, one line per
policy (cluster simulation) or per system (GPU serving sweep), with p99 latencies for the latter."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _lines(
    ax: Any, rows: Sequence[dict[str, Any]], label_key: str, y: str, colors: dict[str, Any] | None = None
) -> None:
    """A line per label; `colors` keeps a label's colour the same in every panel (a panel missing some
    labels would otherwise shift the colour cycle)."""
    for label in sorted({r[label_key] for r in rows}):
        pts = sorted((r["rate_rps"], r[y]) for r in rows if r[label_key] == label and r[y] is not None)
        if pts:
            color = colors.get(label) if colors else None
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label, color=color)


def plot_cluster(rows: Sequence[dict[str, Any]], path: Path, workers: Sequence[int] | None = None) -> None:
    """Goodput against offered load: a panel per (workers, SLO) and pool, a line per policy (only the
    pool sizes in `workers` when given)."""
    rows = [r for r in rows if workers is None or r["workers"] in workers]
    pools = sorted({r["pool"] for r in rows})
    colors = {p: f"C{i % 10}" for i, p in enumerate(sorted({r["policy"] for r in rows}))}  # the default cycle
    cases = sorted({(r["workers"], r["slo"]) for r in rows}, key=lambda c: (c[0], c[1] != "strict"))
    fig, axes = plt.subplots(
        len(cases), len(pools), figsize=(4.2 * len(pools), 3.2 * len(cases)), squeeze=False
    )
    for i, (n, slo) in enumerate(cases):
        for j, pool in enumerate(pools):
            ax = axes[i][j]
            sub = [r for r in rows if (r["workers"], r["slo"], r["pool"]) == (n, slo, pool)]
            _lines(ax, sub, "policy", "goodput_rps", colors)
            top = max((r["rate_rps"] for r in sub), default=1.0)
            ax.plot([0, top], [0, top], color="0.85", lw=0.8, zorder=0)
            ax.set_title(f"{pool}, {n} workers, {slo} SLO", fontsize=9)
            ax.set_xlabel("offered load (req/s)", fontsize=8)
            ax.set_ylabel("goodput (req/s)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", ms=3, label=p) for p, c in colors.items()]
    axes[0][0].legend(handles=handles, fontsize=7)
    # one line where the panels are wide enough for it, two where one pool's column is not
    sep = " " if len(pools) > 1 else "\n"
    title = f"Cluster simulation: Mooncake conversation trace,{sep}goodput against offered load"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_serving(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """GPU serving sweep: goodput (both SLOs), TTFT p99 and ITL p99 against rate, a line per system."""
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for ax, slo in zip(axes[:2], ("strict", "relaxed"), strict=True):
        _lines(ax, [r for r in rows if r["slo"] == slo], "system", "goodput_rps")
        ax.set_title(f"goodput, {slo} SLO", fontsize=9)
        ax.set_ylabel("req/s", fontsize=8)
    one = [r for r in rows if r["slo"] == "strict"]  # latencies do not depend on the SLO
    for ax, (key, unit) in zip(axes[2:], (("ttft_p99_s", "s"), ("itl_p99_ms", "ms")), strict=True):
        _lines(ax, one, "system", key)
        ax.set_title(key.replace("_", " "), fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
    for ax in axes:
        ax.set_xlabel("offered rate (req/s)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
