"""bench/kernels/bench_decode_attention.py's pure steps on the CPU (the script itself needs a CUDA GPU, and
FlashInfer and SGLang for its baselines): the shapes it runs, the tuning's score, the failing checks, and
the record it writes (bench/paths.py's write_record)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench.kernels.bench_decode_attention import failing, parse_shapes, tuning_score
from bench.paths import write_record
from zipkv.kernels.attention.decode_config import parse_kernel_config


def test_shapes_come_from_the_list_else_from_every_batch_and_context() -> None:
    listed = argparse.Namespace(shapes="32x8192,1x32768", batches="1,8", contexts="1024")
    assert parse_shapes(listed) == [(32, 8192), (1, 32768)]
    crossed = argparse.Namespace(shapes="", batches="1,8", contexts="1024,4096")
    assert parse_shapes(crossed) == [(1, 1024), (1, 4096), (8, 1024), (8, 4096)]


def test_tuning_scores_a_config_by_its_mean_fraction_of_the_compressed_read_floor() -> None:
    fast, slow, wrong = (
        parse_kernel_config(t, "--configs") for t in ("32:1:1:2:8:0", "16:1:1:2:8:0", "64:4:1:2:3:0")
    )
    tuning: list[dict[str, object]] = []
    for batch, floor in ((1, 10.0), (8, 40.0)):
        tuning += [
            {"batch": batch, "context": 32, "impl": "read_floor", "median_us": 1.0, "pages": "raw"},
            {"batch": batch, "context": 32, "impl": "read_floor", "median_us": floor},
            {"batch": batch, "context": 32, "impl": "zipkv", "median_us": floor * 2, "config": fast.text},
            {"batch": batch, "context": 32, "impl": "zipkv", "median_us": floor * 4, "config": slow.text},
            {"batch": batch, "context": 32, "impl": "zipkv", "median_us": floor, "config": wrong.text},
        ]
    checks = [{"config": c.text, "bit_identical_to_twin": c is not wrong} for c in (fast, slow, wrong)]
    good, score = tuning_score(tuning, checks)
    assert good == {fast.text, slow.text}
    assert (score(fast), score(slow), score(wrong)) == (0.5, 0.25, 0.0)  # not bit identical: never picked
    assert max([slow, wrong, fast], key=score) is fast


def test_a_check_fails_off_its_twin_or_the_reference() -> None:
    ok: dict[str, object] = {"bit_identical_to_twin": True, "rel_err_zipkv": 1e-3}
    assert failing([ok, {"decompress_then_attend_rel_err": 0.5}]) == 0  # only zipkv's own errors count
    assert failing([ok, {**ok, "bit_identical_to_twin": False}]) == 1
    assert failing([{**ok, "rel_err_zipkv": 0.02}, {**ok, "rel_err_zipkv": math.nan}]) == 2
    assert failing([{"bit_identical_to_twin": False, "rel_err_zipkv": 1.0}]) == 2


def test_the_record_is_written_into_a_new_folder_as_indented_json(tmp_path: Path) -> None:
    out = tmp_path / "new" / "decode_attention.json"
    record = {"rows": [{"impl": "zipkv", "median_us": 1.5}], "checks": []}
    write_record(str(out), record)
    assert json.loads(out.read_text()) == record
    assert out.read_text() == json.dumps(record, indent=1)
