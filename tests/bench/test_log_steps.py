"""bench/serving/log_steps.py: decode-only intervals from SGLang's log lines, and the line through them."""

from __future__ import annotations

import json
from pathlib import Path

from bench.serving.log_steps import StepPoint, decode_points, fit, main

LOG = """\
[2026-12-05 16:14:42] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 512, token usage: 0.60
[2026-12-05 16:14:43] Decode batch, #running-req: 23, #token: 368000, token usage: 0.95, cuda graph: True, gen throughput (token/s): 1017.70, #queue-req: 0
[2026-12-05 16:14:44] Decode batch, #running-req: 23, #token: 368920, token usage: 0.95, cuda graph: True, gen throughput (token/s): 1000.00, #queue-req: 0
[2026-12-05 16:14:45] Prefill batch, #new-seq: 1, #new-token: 16, #cached-token: 6752, token usage: 0.95
[2026-12-05 16:14:46] Decode batch, #running-req: 13, #token: 243000, token usage: 0.62, cuda graph: True, gen throughput (token/s): 800.00, #queue-req: 0
[2026-12-05 16:14:47] Decode batch, #running-req: 13, #token: 243520, token usage: 0.62, cuda graph: True, gen throughput (token/s): 812.50, #queue-req: 0
[2026-12-05 16:14:48] Decode batch, #running-req: 0, #token: 0, token usage: 0.00, cuda graph: True, gen throughput (token/s): 0.00, #queue-req: 0
"""  # noqa: E501  (SGLang's own line format)


def test_only_intervals_without_a_prefill_count() -> None:
    points = decode_points(LOG.splitlines())
    # the first decode line after each prefill opens an interval that held the prefill: not a point
    assert points == [StepPoint(23, 368920, 23.0), StepPoint(13, 243520, 16.0)]


def test_the_line_through_the_points() -> None:
    points = [StepPoint(1, 100_000 * k, 5.0 + 2.0 * k) for k in range(4)]
    got = fit(points)
    assert (
        got is not None and abs(got["fixed_ms"] - 5.0) < 1e-6 and abs(got["ms_per_100k_tokens"] - 2.0) < 1e-6
    )
    assert fit(points[:2]) is None  # too few to fit


def test_the_command_writes_the_record_and_the_plot(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LOG * 2)
    out = tmp_path / "steps.json"
    assert main(["--log", f"sglang={log}", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert len(record["systems"]["sglang"]["points"]) == 4 and out.with_suffix(".png").stat().st_size > 0
