"""Where the benchmarks' committed files are: results (the records), configs and data, and the repo root;
and write_record, which puts a kernel benchmark's JSON record on disk."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
CONFIGS = BENCH / "configs"
DATA = BENCH / "data"


def write_record(path: str | Path, record: object) -> None:
    """``record`` as indented JSON at ``path``, its folder made first (the kernel benchmarks write theirs
    again after every shape, so a cut-short run keeps what it measured)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1))
