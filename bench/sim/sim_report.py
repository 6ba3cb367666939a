"""The cluster simulation's JSON: rows with knees, a summary per pool / size / SLO, and the step model.

Per (pool, workers, SLO) the summary gives each policy's knee (rate of peak goodput), goodput there, the
highest rate it sustains at 90% attainment and where it starts shedding (>= 1% of requests refused), and
zipkv's placement against the best other policy (zipkv's own variants, e.g. `zipkv_no_shed`, are not
"other"); a variant such as `zipkv_affinity` also against the best other policy and against `zipkv`.
`stacks` compares the two deployments a team would choose between: zipkv workers behind zipkv's router
against SGLang's workers behind the best baseline policy and behind sglang-router's default
(cache_aware).
"""

from __future__ import annotations

from typing import Any

from bench.serving.serving_metrics import shed_onset_rps, with_knees
from bench.sim.step_model import ATTENTION_PER_CONTEXT_TOKEN, StepModel

STEP_MODEL_FORM = (
    "decode_ms = fixed_ms + ms_per_kv_gb[system] * (context tokens of the batch x 131072 B / 1e9); "
    "prefill_ms = fixed_ms + new * (1 + a * (start + new / 2)) / prefill_tokens_per_s[system], "
    f"a = {ATTENTION_PER_CONTEXT_TOKEN:.3e} per context token (attention FLOPs over weight FLOPs)"
)


def _policy_summary(group: list[dict[str, Any]]) -> dict[str, Any]:
    top = group[0]
    return {
        "knee_rps": top["knee_rps"],
        "goodput_at_knee_rps": top["goodput_at_knee_rps"],
        "sustained_rps": top["sustained_rps"],
        "shed_onset_rps": shed_onset_rps(group),
        "best_attainment": max(r["attainment"] for r in group),
    }


def _variant_ratios(policies: dict[str, Any], best_other: float | None) -> dict[str, float | None]:
    """Each zipkv variant (e.g. `zipkv_affinity`) against the best other policy and against `zipkv`."""
    out: dict[str, float | None] = {}
    z = policies["zipkv"]["goodput_at_knee_rps"]
    for name, p in policies.items():
        if not name.startswith("zipkv_") or name == "zipkv_no_shed":
            continue
        g = p["goodput_at_knee_rps"]
        out[f"{name}_over_best_other"] = round(g / best_other, 3) if g and best_other else None
        out[f"{name}_over_zipkv"] = round(g / z, 3) if g and z else None
    return out


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["pool"], r["workers"], r["slo"]) for r in rows}, key=str)
    for pool, n, slo in keys:
        mine = [r for r in rows if (r["pool"], r["workers"], r["slo"]) == (pool, n, slo)]
        policies = {
            p: _policy_summary([r for r in mine if r["policy"] == p])
            for p in sorted({r["policy"] for r in mine})
        }
        entry: dict[str, Any] = {"pool": pool, "workers": n, "slo": slo, "policies": policies}
        others = {p: v for p, v in policies.items() if not p.startswith("zipkv")}
        if "zipkv" in policies and others:
            best = max(others, key=lambda p: others[p]["goodput_at_knee_rps"] or 0.0)
            z, b = policies["zipkv"]["goodput_at_knee_rps"], others[best]["goodput_at_knee_rps"]
            entry.update(best_other=best, zipkv_over_best_other=round(z / b, 3) if z and b else None)
            entry.update(_variant_ratios(policies, b))
        out.append(entry)
    return out


def stacks(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in summary:
        if s["pool"] != "zipkv" or "zipkv" not in s["policies"]:
            continue
        other = next(
            (t for t in summary if (t["pool"], t["workers"], t["slo"]) == ("sglang", s["workers"], s["slo"])),
            None,
        )
        if other is None:
            continue
        baselines = [p for p in other["policies"] if not p.startswith("zipkv")]  # what SGLang ships with
        best = max(baselines, key=lambda p: other["policies"][p]["goodput_at_knee_rps"] or 0.0)
        z = s["policies"]["zipkv"]["goodput_at_knee_rps"]
        row = {
            "workers": s["workers"],
            "slo": s["slo"],
            "zipkv_goodput_at_knee_rps": z,
            "sglang_best_policy": best,
        }
        for name, p in (("best", best), ("cache_aware", "cache_aware")):
            g = other["policies"].get(p, {}).get("goodput_at_knee_rps")
            row[f"sglang_{name}_goodput_at_knee_rps"] = g
            row[f"zipkv_over_sglang_{name}"] = round(z / g, 3) if z and g else None
        out.append(row)
    return out


def build_report(
    meta: dict[str, Any],
    models: dict[str, StepModel],
    decode_table: list[dict[str, object]],
    replay: list[dict[str, object]],
    rows: list[dict[str, object]],
) -> dict[str, Any]:
    keyed = with_knees(rows, ("pool", "workers", "policy", "slo"))
    summary = summarise(keyed)  # type: ignore[arg-type]
    return {
        **meta,
        "step_model": {
            "form": STEP_MODEL_FORM,
            "fixed_ms": round(next(iter(models.values())).fixed_ms, 4),
            "systems": {
                s: {"ms_per_kv_gb": round(m.ms_per_kv_gb, 5), "prefill_tokens_per_s": m.prefill_tokens_per_s}
                for s, m in models.items()
            },
            "decode_fit": decode_table,
            "replay_of_measured_runs": replay,
        },
        "summary": summary,
        "stacks": stacks(summary),
        "rows": keyed,
    }
