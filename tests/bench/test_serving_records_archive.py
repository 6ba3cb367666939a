"""serving_goodput --in takes a call's serving_records.tgz (run_serving_gpu.sh packs serving/ into it on the
GPU machine) as it takes the folder: the same table from either, and nothing unpacked outside its folder."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench.serving import serving_goodput as sg


def _request(ttft_s: float) -> dict[str, Any]:
    gaps = [0.01] * 3
    return {"ok": True, "shed": False, "ttft_s": ttft_s, "itl_s": gaps, "output_tokens": 4,
            "start_s": 0.0, "latency_s": ttft_s + sum(gaps), "error": ""}  # fmt: skip


def _serving_dir(root: Path) -> Path:
    serving = root / "serving"
    for system, ttfts in (("zipkv", [0.5, 0.5, 9.0]), ("sglang_gateway", [0.5, 9.0, 9.0])):
        (serving / system).mkdir(parents=True)
        reqs = [_request(t) for t in ttfts]
        rec = {"system": system, "rate_rps": 1.0, "duration_s": 3.0, "wall_s": 3.0, "client": "c",
               "workload": {"requests": 3, "offset": 0}, "requests": reqs}  # fmt: skip
        (serving / system / "rate_1.json").write_text(json.dumps(rec))
    return serving


def _table(tmp_path: Path, in_path: Path, name: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    argv = ["--in", str(in_path), "--device", "test", "--command", "pytest", "--out", str(out)]
    assert sg.main(argv) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_the_archive_gives_the_folders_table(tmp_path: Path) -> None:
    serving = _serving_dir(tmp_path / "call")
    archive = tmp_path / "serving_records.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(serving, arcname="serving")  # as `tar -C $OUT -czf ... serving` packs it
    from_dir = _table(tmp_path, serving, "dir")
    from_tgz = _table(tmp_path, archive, "tgz")
    assert from_tgz["rows"] == from_dir["rows"] and from_tgz["headline"] == from_dir["headline"]
    assert from_tgz["headline"]["strict"]["zipkv_over_sglang_gateway"] == pytest.approx(2.0)


def test_an_archive_packed_at_its_root_is_read_too(tmp_path: Path) -> None:
    serving = _serving_dir(tmp_path / "call")
    archive = tmp_path / "root.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for system in ("zipkv", "sglang_gateway"):
            tar.add(serving / system, arcname=system)
    assert len(_table(tmp_path, archive, "root")["rows"]) == len(_table(tmp_path, serving, "dir")["rows"])


def test_an_archive_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.OutsideDestinationError):
        sg.unpacked(archive, tmp_path / "into")
    assert not (tmp_path / "escaped.txt").exists()


def test_a_folder_is_taken_as_it_is(tmp_path: Path) -> None:
    assert sg.unpacked(tmp_path, tmp_path / "unused") == tmp_path
