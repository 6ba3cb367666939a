"""Decode step times read from SGLang's own log lines, for systems compared on the same trace.

    python -m bench.serving.log_steps --log sglang_gateway=SERVER.log --log zipkv=REPLICA.log \
        --out bench/results/serving_decode_steps.json      (+ .png beside it)

SGLang logs a "Decode batch" line every 40 decode steps with the running requests, the KV tokens they hold
and the generated tokens per second since the previous line. Where no "Prefill batch" line falls between
two decode lines, that interval was decode only, so one step took running x 1000 / throughput ms (the
running count can change inside the interval: an estimate, good to a few percent). These points are the
step times the serving sweep's requests actually saw (docs/benchmarks.md, "Serving under SLO ... three
systems"), against the KV tokens of the batch; a least-squares line per system (fixed ms + ms per 100k KV
tokens) summarises each. The token count is SGLang's used count (the pool less what is free or evictable);
under zipkv with compression on, free space is counted compression-aware, so the count reads low by up to
the compression ratio (~0.76) and that system's points sit left of where its raw tokens would put them.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

DECODE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+).*gen throughput \(token/s\): ([\d.]+)")
PREFILL = "Prefill batch"


@dataclass(frozen=True)
class StepPoint:
    running: int
    kv_tokens: int
    step_ms: float


def decode_points(lines: Iterable[str]) -> list[StepPoint]:
    """The decode-only intervals of one log (a decode line whose previous line of either kind was a
    decode line); intervals with nothing generated are skipped."""
    points, prev_decode = [], False
    for line in lines:
        if PREFILL in line:
            prev_decode = False
            continue
        m = DECODE.search(line)
        if m is None:
            continue
        running, tokens, tok_s = int(m[1]), int(m[2]), float(m[3])
        if prev_decode and running and tok_s > 0:
            points.append(StepPoint(running, tokens, round(1000.0 * running / tok_s, 3)))
        prev_decode = True
    return points


def fit(points: Sequence[StepPoint]) -> dict[str, float] | None:
    """step_ms = fixed_ms + ms_per_100k_tokens x kv_tokens / 1e5, least squares (None below 3 points)."""
    if len(points) < 3:
        return None
    fixed, slope, rms = line_fit([p.kv_tokens for p in points], [p.step_ms for p in points])
    return {
        "fixed_ms": round(fixed, 3),
        "ms_per_100k_tokens": round(slope, 3),
        "rms_residual_ms": round(rms, 3),
    }


def line_fit(kv_tokens: Sequence[float], step_ms: Sequence[float]) -> tuple[float, float, float]:
    """(fixed ms, ms per 100k KV tokens, rms residual ms): the least-squares line of step_ms on kv_tokens."""
    x = np.array([[1.0, t / 1e5] for t in kv_tokens])
    y = np.array(step_ms, dtype=float)
    (fixed, slope), *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ np.array([fixed, slope])
    return float(fixed), float(slope), float(np.sqrt((resid**2).mean()))


def summarise(logs: dict[str, Path]) -> dict[str, object]:
    systems = {}
    for name, path in logs.items():
        points = decode_points(path.read_text(errors="replace").splitlines())
        systems[name] = {"log": path.name, "fit": fit(points), "points": [asdict(p) for p in points]}
    return {"systems": systems}


def plot(summary: dict[str, object], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (name, s) in enumerate(summary["systems"].items()):  # type: ignore[attr-defined]
        pts = s["points"]
        ax.scatter([p["kv_tokens"] / 1e3 for p in pts], [p["step_ms"] for p in pts], s=10, color=f"C{i}",
                   label=f"{name} ({len(pts)} intervals)")  # fmt: skip
        if s["fit"]:
            xs = np.linspace(0, max(p["kv_tokens"] for p in pts), 50)
            ax.plot(xs / 1e3, s["fit"]["fixed_ms"] + s["fit"]["ms_per_100k_tokens"] * xs / 1e5, color=f"C{i}")
    ax.set(xlabel="KV tokens of the running batch (thousands)", ylabel="decode step (ms)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", action="append", required=True, metavar="SYSTEM=PATH", help="repeatable")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="Decode steps seen on the trace (SGLang's log lines)")
    ap.add_argument("--device", default="", help="recorded with the figures")
    args = ap.parse_args(argv)
    logs = {}
    for item in args.log:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            ap.error(f"--log {item!r}: expected SYSTEM=PATH of an existing log file")
        logs[name] = Path(path)
    summary = {"device": args.device, **summarise(logs)}
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    plot(summary, args.out.with_suffix(".png"), args.title)
    for name, s in summary["systems"].items():  # type: ignore[attr-defined]
        print(f"[log_steps] {name}: {len(s['points'])} decode-only intervals, fit {s['fit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
