"""bench/allocator/encode_launch.py on the CPU: the pool's encode launch timed by part, on real KV."""

from __future__ import annotations

import json
from pathlib import Path

from bench.allocator.encode_launch import main


def test_the_launch_is_timed_whole_and_by_part(tmp_path: Path) -> None:
    out = tmp_path / "encode_launch.json"
    main(["--pages", "6", "--layers", "2", "--kv-heads", "1", "--head-dim", "64", "--trials", "2",
          "--warmup", "1", "--device", "cpu", "--out", str(out)])  # fmt: skip
    got = json.loads(out.read_text())
    assert got["device"].startswith("CPU") and "--pages 6" in got["command"]
    assert [r["copies"] for r in got["rows"]] == ["words", "bytes", "triton"]
    assert set(got["launch_over_words"]) == {"bytes", "triton"} and min(got["launch_over_words"].values()) > 0
    for rec in got["rows"]:
        assert rec["pages"] == 6 and rec["trials"] == 2
        assert rec["raw_bytes"] == 6 * 2 * 4096  # one KV head of 64: 4 KiB raw pages
        assert 0.0 < rec["encoder_device_ms"] < rec["launch_device_ms"]  # the encoder is a part of the launch
        parts = rec["encoder_device_ms"] + rec["pack_and_tables_device_ms"]
        assert abs(parts - rec["launch_device_ms"]) < 0.05 * rec["launch_device_ms"]  # medians of the parts
