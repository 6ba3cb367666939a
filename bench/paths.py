"""Where the benchmarks' committed files are: results (the records), configs and data, and the repo root."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
CONFIGS = BENCH / "configs"
DATA = BENCH / "data"
