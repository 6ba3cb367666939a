"""`/readyz`: ready only when every configured model has a worker that can take requests.

A router that answers 200 while every completion would get 503 sends a load balancer's traffic into a
wall. Pure function of a snapshot (clock passed in). Not ready (503): some model has no live,
non-draining worker. Degraded (200, still serving): the shared state is unreachable (serving from the
last snapshot) or a model's workers all report stale. Each state is named in `reasons`.
"""

from __future__ import annotations

from typing import Any

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.state import Snapshot


def _model_state(snap: Snapshot, cfg: RouterConfig, model: str, now_s: float) -> dict[str, int]:
    expire_s = cfg.placement.expire_after_ms / 1000.0
    stale_s = cfg.placement.stale_after_ms / 1000.0
    counts = {"workers": 0, "ready": 0, "draining": 0, "expired": 0, "stale": 0}
    for v in snap.workers:
        if v.model != model:
            continue
        counts["workers"] += 1
        if now_s - v.received_s > expire_s and not v.pinned:
            counts["expired"] += 1
        elif v.draining:
            counts["draining"] += 1
        else:
            counts["ready"] += 1
            counts["stale"] += int(now_s - v.received_s > stale_s)
    return counts


def readiness(snap: Snapshot, cfg: RouterConfig, now_s: float, inflight: int) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of /readyz."""
    models = {m.name: _model_state(snap, cfg, m.name, now_s) for m in cfg.models}
    reasons = []
    if snap.degraded:
        reasons.append("state_unreachable: shared state (Redis) unreachable; serving from the last snapshot")
    unready = [name for name, c in models.items() if c["ready"] == 0]
    for name in unready:
        c = models[name]
        reasons.append(
            f"no_worker: model {name!r} has no worker that can take requests "
            f"({c['draining']} draining, {c['expired']} expired)"
        )
    for name, c in models.items():
        if c["ready"] and c["stale"] == c["ready"]:
            reasons.append(
                f"stale_reports: every worker of model {name!r} reports late; placing on headroom only"
            )
    status = "unavailable" if unready else "degraded" if reasons else "ok"
    body = {
        "status": status,
        "degraded": snap.degraded,
        "reasons": reasons,
        "models": models,
        "workers": len(snap.workers),
        "inflight_requests": inflight,
    }
    return (503 if unready else 200), body
