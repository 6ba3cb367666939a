"""Where a decode step's GPU time goes, per system: the step profiles of an SGLang end-to-end record
(bench_sglang_e2e.py's ``--profile-steps``, grouped by bench/serving/step_profile.py) as stacked bars, the
whole step and the same per running request (the unit a larger batch is paid in)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

# step_profile.py's kernel groups in stack order: the attention groups first (what the systems differ in),
# then the rest of the model.
GROUP_COLORS = {
    "attention_zipkv": "#d62728",
    "attention_flashinfer": "#1f77b4",
    "attention_merge": "#ff9896",
    "gemm": "#7f7f7f",
    "norm_rope_act": "#bcbd22",
    "kv_store": "#17becf",
    "sampling": "#9467bd",
    "other": "#c7c7c7",
}


def profiled_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in data.get("rows", []) if r.get("rc", 0) == 0 and r.get("step_profile")]


def step_profile_figure(data: dict[str, Any]) -> Figure:
    """Two panels, ms per step and ms per step per running request, one stacked bar per profiled run."""
    rows = profiled_rows(data)
    labels = [f"{r['system']}\n{r['max_running_requests']} running" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.2 + 0.7 * len(rows)))
    for ax, per_request in zip(axes, (False, True), strict=True):
        left = [0.0] * len(rows)
        for group, color in GROUP_COLORS.items():
            widths = [
                r["step_profile"]["groups_ms_per_step"].get(group, 0.0)
                / (r["max_running_requests"] if per_request else 1)
                for r in rows
            ]
            if any(widths):
                ax.barh(labels, widths, left=left, color=color, label=group)
                left = [a + w for a, w in zip(left, widths, strict=True)]
        for y, (total, r) in enumerate(zip(left, rows, strict=True)):
            logged = r["decode_step_ms"] / (r["max_running_requests"] if per_request else 1)
            ax.text(total, y, f" {total:.3g} (step in log {logged:.3g})", va="center", fontsize=7)
        ax.set_xlim(0, max(left) * 1.35)
        ax.invert_yaxis()
        ax.set_xlabel("GPU ms per step per running request" if per_request else "GPU ms per step")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), frameon=False, fontsize=7)
    device = data.get("device", "")
    fig.suptitle(f"A decode step at the largest batch, by kernel group: {device}", fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 0.92))
    return fig
