"""bench/sim/prefill_compare.py: every fitted prefill model priced on every system's measured batches."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from bench.sim.prefill_compare import LOGS, WINDOWS, compare, main


def prefill(new: int, pending: int, tok_s: float) -> str:
    return (
        f"[t] Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: 0, token usage: 0.1, "
        f"#running-req: 0, #queue-req: 0, #pending-token: {pending}, cuda graph: False, "
        f"input throughput (token/s): {tok_s}"
    )


# One prompt of 16384 tokens in two chunks: the second is back to back, (8192 new, context 8192), 200 ms
# under the first system's log, 100 ms under the others'.
def log(second_ms: float) -> str:
    return "\n".join([prefill(8192, 8192, 1.0), prefill(8192, 0, 8192 / second_ms * 1e3)])


def fit(per_1k: float, per_1m_pairs: float) -> dict[str, float]:
    return {"fixed_ms": 5.0, "ms_per_1k_tokens": per_1k, "ms_per_1m_pairs": per_1m_pairs,
            "chain_batches": 2, "batches": 3, "median_abs_error": 0.0}  # fmt: skip


def test_each_model_prices_the_same_batches_and_the_ratio_is_against_sglangs(tmp_path: Path) -> None:
    archive = tmp_path / "records.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for window in WINDOWS:
            for system, member in LOGS.items():
                data = log(200.0 if system == "sglang" else 100.0).encode()
                info = tarfile.TarInfo(f"{window}/{member}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    fits = {"sglang": fit(20.0, 1.0), "zipkv": fit(10.0, 2.0), "zipkv_uncompressed": fit(10.0, 1.0)}
    record = tmp_path / "fits.json"
    record.write_text(json.dumps({"systems": {n: {"prefill": f} for n, f in fits.items()}}))
    out = compare(archive, record)
    assert len(out["rows"]) == len(WINDOWS) * len(LOGS)
    sglang_row = next(r for r in out["rows"] if r["batches_of"] == "sglang")
    # the first chunk's gap is not its own forward: one batch counts
    assert (sglang_row["batches"], sglang_row["new_tokens"]) == (1, 8192)
    assert sglang_row["measured_ms"] == pytest.approx(200.0)
    assert sglang_row["measured_ms_per_1k_tokens"] == pytest.approx(200.0 / 8.192, abs=1e-3)
    pairs_m = 8192 * (8192 + 4096) / 1e6
    expect = {
        n: 5.0 + f["ms_per_1k_tokens"] * 8.192 + f["ms_per_1m_pairs"] * pairs_m for n, f in fits.items()
    }
    assert sglang_row["model_ms"] == pytest.approx(expect, abs=0.1)
    # zipkv's per-token cost is half SGLang's, its attention slope double: which is cheaper is the sum
    assert sglang_row["vs_sglang"]["zipkv"] == pytest.approx(expect["zipkv"] / expect["sglang"], abs=1e-3)
    assert sglang_row["vs_sglang"]["zipkv"] > 1.0 > sglang_row["vs_sglang"]["zipkv_uncompressed"]


def test_a_missing_archive_is_named_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no such file: .*absent\.tgz"):
        main(["--archive", str(tmp_path / "absent.tgz"), "--out", str(tmp_path / "out.json")])
