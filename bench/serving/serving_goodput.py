"""The serving sweep's table: bench/results/serving_goodput.json (+ serving_goodput.png) from the per-request
records bench/serving/serving_sweep.py wrote (DIR/SYSTEM/rate_R.json, SGLang bench_serving's measurements).

    python -m bench.serving.serving_goodput --in $OUT/serving --device "$(nvidia-smi ...)" --command "..." \\
        --out bench/results/serving_goodput.json

Rows: one per system, SLO and rate, with `system`, `slo`, `rate_rps`, `goodput_rps`, `ttft_p50_s`,
`ttft_p99_s`, `itl_p50_ms`, `itl_p99_ms`, `output_tokens_per_s`, `knee_rps` (serving_metrics.py defines
each) and the counts behind them; `in_flight` per system and rate: requests sent and not yet finished,
sampled every second from the client's own start and latency of each request. `headline`: zipkv's goodput at
its knee over SGLang's at its knee, per SLO: `sglang_gateway` (one GPU: SGLang's server directly) or, on two
GPUs, the best of the gateway's policies (`sglang_gateway_POLICY`), named in `baseline`. `--in` may be
given more than once (one folder per device call); a system found in two of them is an error, not a merge,
unless --pool-windows says each folder is one trace window of every system (OFFSET 0, 32, ...): then each
system's rate is pooled over the windows (bench/serving/serving_windows.py) and `windows` holds each window's
own headline. An `--in` may also be a call's `serving_records.tgz` (bench/run_serving_gpu.sh packs its
serving/ folder into it on the GPU machine, so that one file comes back however many the sweep wrote): it
is unpacked into a temporary folder and read as that folder.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.serving.serving_metrics import SLOS, Outcome, mean_itl_ms, rate_row, with_knees
from bench.serving.serving_windows import pool_all, span_s, window_of


def outcomes(records: list[dict[str, Any] | None]) -> tuple[list[Outcome], list[float]]:
    """Per request an Outcome, and every inter-chunk gap in ms (bench_serving's ITLs)."""
    outs: list[Outcome] = []
    gaps: list[float] = []
    for r in records:
        if r is None or not r["ok"]:
            outs.append(Outcome(ok=False, shed=bool(r and r["shed"])))
            continue
        itl = mean_itl_ms(r["ttft_s"], r["itl_s"], r["output_tokens"])
        outs.append(Outcome(ok=True, ttft_s=r["ttft_s"], mean_itl_ms=itl, output_tokens=r["output_tokens"]))
        gaps.extend(1000.0 * g for g in r["itl_s"])
    return outs, gaps


def in_flight(records: list[dict[str, Any] | None], step_s: float = 1.0) -> list[int]:
    spans = [(r["start_s"], r["start_s"] + r["latency_s"]) for r in records if r is not None]
    end = max((b for _, b in spans), default=0.0)
    return [sum(a <= k * step_s < b for a, b in spans) for k in range(int(end / step_s) + 1)]


def rows_for(rate_file: dict[str, Any]) -> list[dict[str, object]]:
    outs, gaps = outcomes(rate_file["requests"])
    duration = float(rate_file.get("duration_s") or rate_file["wall_s"])
    rate, span = float(rate_file["rate_rps"]), span_s(rate_file)
    return [
        {"system": rate_file["system"], **rate_row(outs, rate, duration, slo, gaps, span_s=span)}
        for slo in SLOS
    ]


def best_baseline(at: dict[str, float | None]) -> str | None:
    """SGLang's system to compare with: its server directly when measured, else the gateway policy with the
    highest goodput at its knee (ties: the name first in order, so the choice is reproducible)."""
    if "sglang_gateway" in at:
        return "sglang_gateway"
    gateways = sorted(k for k in at if k.startswith("sglang_gateway_"))
    return max(gateways, key=lambda k: at[k] or 0.0) if gateways else None


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for slo in SLOS:
        at = {r["system"]: r["goodput_at_knee_rps"] for r in rows if r["slo"] == slo.name}
        base = best_baseline(at)
        z, s = at.get("zipkv"), at.get(base) if base else None
        out[slo.name] = {
            "baseline": base,
            "zipkv_goodput_at_knee_rps": z,
            "sglang_gateway_goodput_at_knee_rps": s,
            "zipkv_over_sglang_gateway": round(z / s, 3) if z and s else None,
        }
    return out


ARCHIVE_SUFFIXES = (".tgz", ".tar.gz")


def unpacked(path: Path, into: Path) -> Path:
    """`path` itself when it is a folder; an archive of one (SYSTEM/rate_R.json under its top folder, or at
    its root) unpacked under `into`, and the folder that holds the systems returned."""
    if path.is_dir() or not path.name.endswith(ARCHIVE_SUFFIXES):
        return path
    into.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(dir=into))
    with tarfile.open(path) as tar:
        tar.extractall(dest, filter="data")  # "data": no absolute paths, links out or device files
    tops = [d for d in dest.iterdir() if d.is_dir()]
    if len(tops) == 1 and any(tops[0].glob("*/rate_*.json")):
        return tops[0]
    return dest


def rate_files(in_dirs: list[Path]) -> list[Path]:
    """Every SYSTEM/rate_R.json under the folders, each system from one folder only: two calls that both
    measured a system would otherwise mix their rates silently."""
    owner: dict[str, Path] = {}
    files: list[Path] = []
    for d in in_dirs:
        for path in sorted(d.glob("*/rate_*.json")):
            system = path.parent.name
            if owner.setdefault(system, d) != d:
                raise SystemExit(f"{system} is in both {owner[system]} and {d}: keep one of them")
            files.append(path)
    return files


def load_records(in_dirs: list[Path], pool_windows: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rate records to tabulate (pooled over windows when asked: one folder per window) and the running
    requests over time per system and rate (per window when pooled: pooled arrivals overlap)."""
    raw = (
        [json.loads(p.read_text()) for d in in_dirs for p in rate_files([d])]
        if pool_windows
        else [json.loads(p.read_text()) for p in rate_files(in_dirs)]
    )
    flight: dict[str, dict[str, list[int]]] = {}
    for rec in raw:
        key = f"{rec['rate_rps']:g}" + (f"@offset{window_of(rec)[0]}" if pool_windows else "")
        flight.setdefault(rec["system"], {})[key] = in_flight(rec["requests"])
    if not (pool_windows and raw):
        return raw, flight
    try:
        return pool_all(raw), flight
    except ValueError as e:  # windows that do not pool (one missing, one twice): say which, no traceback
        raise SystemExit(f"--pool-windows: {e}") from None


def system_notes(in_dirs: list[Path]) -> dict[str, Any]:
    systems: dict[str, Any] = {}
    for d in in_dirs:
        for path in sorted(d.glob("*/system.json")):
            rec = json.loads(path.read_text())
            systems.setdefault(
                rec["system"], {k: rec.get(k) for k in ("note", "startup_s", "options", "sweep_rc", "wall_s")}
            )
    return systems


def build(in_dir: Path | list[Path], device: str, command: str, pool_windows: bool = False) -> dict[str, Any]:
    in_dirs = in_dir if isinstance(in_dir, list) else [in_dir]
    records, flight = load_records(in_dirs, pool_windows)
    if not records:
        raise SystemExit(
            f"no rate records under {', '.join(map(str, in_dirs))} (expected SYSTEM/rate_R.json from "
            "serving_sweep.py)"
        )
    rows: list[dict[str, object]] = []
    workload = None
    for rec in records:
        rows += rows_for(rec)
        if workload is not None and rec["workload"] != workload:
            raise SystemExit(
                f"{rec['system']}: another trace window than the other records ({rec['workload']})"
            )
        workload = rec["workload"]
    # the backends differ: /generate through the gateway
    client = " | ".join(sorted({rec["client"] for rec in records}))
    keyed = with_knees(rows, ("system", "slo"))
    keyed.sort(key=lambda r: (str(r["system"]), str(r["slo"]), float(r["rate_rps"])))  # type: ignore[arg-type]
    report = {
        "device": device,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "client": client,
        "workload": workload,
        "slos": [{"name": s.name, "ttft_s": s.ttft_s, "mean_itl_ms": s.mean_itl_ms} for s in SLOS],
        "systems": system_notes(in_dirs),
        "headline": headline(keyed),  # type: ignore[arg-type]
        "rows": keyed,
        "in_flight_per_s": flight,
    }
    if pool_windows:  # each window's own headline beside the pooled one: how far one window's sample moves it
        report["windows"] = [
            {"workload": w["workload"], "headline": w["headline"]}
            for w in (build(d, device, command) for d in in_dirs)
        ]
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.serving.serving_goodput", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--in",
        dest="in_dir",
        type=Path,
        action="append",
        required=True,
        help="serving_sweep.py's --out-dir, or a call's serving_records.tgz of it",
    )
    p.add_argument(
        "--pool-windows",
        action="store_true",
        help="each --in folder is one trace window of every system: pool them (serving_windows.py)",
    )
    p.add_argument("--device", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--out", type=Path, default=RESULTS / "serving_goodput.json")
    p.add_argument("--plot", type=Path, default=None, help="default: the --out path with .png")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        in_dirs = [unpacked(d, Path(tmp)) for d in args.in_dir]
        report = build(in_dirs, args.device, args.command, args.pool_windows)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    from bench.serving.serving_plots import plot_serving

    plot = args.plot or args.out.with_suffix(".png")
    plot_serving(report["rows"], plot, f"Serving under SLO, Mooncake trace ({args.device})")
    for r in report["rows"]:
        print(
            json.dumps(
                {k: r[k] for k in ("system", "slo", "rate_rps", "goodput_rps", "attainment", "knee_rps")}
            )
        )
    print(json.dumps(report["headline"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
