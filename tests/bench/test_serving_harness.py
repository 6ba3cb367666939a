"""The GPU serving sweep's harness, off the GPU: the id tokenizer on both sides, SGLang's server flags
against SGLang 0.5.17's own ServerArgs, and the arguments the client takes from bench_serving's parser."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from bench.serving.id_tokenizer import build
from bench.serving.serving_sweep import starts_in_time
from bench.serving.serving_systems import sglang_server_cmd
from zipkv.controlplane.tokenizer import HFTokenizer, IncrementalDetokenizer

ROOT = Path(__file__).resolve().parents[2]

SGLANG_SRC = Path(os.environ.get("ZIPKV_SGLANG_SRC", ROOT / ".cache" / "sglang-0.5.17"))


def _script_sglang_args() -> dict[str, object]:
    text = (ROOT / "bench" / "run_serving_gpu.sh").read_text()
    m = re.search(r"SGLANG_ARGS=\$\{SGLANG_ARGS:-'(\{.*?\})'\}", text)
    assert m, "run_serving_gpu.sh no longer sets its default SGLANG_ARGS"
    return dict(json.loads(m.group(1)))


def test_every_generated_token_renders_as_one_word(tmp_path: Path) -> None:
    tok = HFTokenizer(build(259, tmp_path / "tok"))
    assert tok.vocab_size == 259 and tok.eos_token_id is None  # no special ids: EOS never ends a stream
    detok = IncrementalDetokenizer(tok)
    assert [detok.push([i]) for i in (0, 256, 257, 258, 7)] == ["t0", " t256", " t257", " t258", " t7"]


def test_sglang_server_flags_are_sglang_0_5_17_server_args(tmp_path: Path) -> None:
    source = SGLANG_SRC / "sglang" / "srt" / "server_args.py"
    if not source.is_file():
        pytest.skip(f"no SGLang 0.5.17 source at {SGLANG_SRC} (scripts/setup.sh unzips it)")
    fields = set(re.findall(r"^    (\w+): ", source.read_text(), flags=re.M))
    opts = {"model": "m", "tokenizer": "t", "budget_tokens": 388608, "max_running": 64,
            "sglang_args": _script_sglang_args()}  # fmt: skip
    cmd = sglang_server_cmd(opts, 30000)
    flags = [a[2:].replace("-", "_") for a in cmd if a.startswith("--")]
    assert "disable_radix_cache" not in flags  # false: the radix cache stays on
    assert {"chunked_prefill_size", "cuda_graph_max_bs_decode", "max_total_tokens", "load_format"} <= set(
        flags
    )
    unknown = [f for f in flags if f not in fields]
    assert not unknown, f"not SGLang 0.5.17 server arguments: {unknown}"
    assert cmd[cmd.index("--max-total-tokens") + 1] == "388608"


def test_the_client_takes_bench_servings_own_arguments(tmp_path: Path) -> None:
    if not (SGLANG_SRC / "sglang" / "benchmark" / "serving.py").is_file():
        pytest.skip(f"no SGLang 0.5.17 source at {SGLANG_SRC}")
    for module in ("torchvision", "datasets", "pybase64"):  # what bench_serving's imports pull in
        pytest.importorskip(module, reason=f"SGLang's bench_serving imports {module}; not installed here")
    sys.path.insert(0, str(SGLANG_SRC))
    try:
        from bench.serving.serving_client import bench_args, import_bench_serving

        serving, _ = import_bench_serving()
        args = bench_args(serving, "http://127.0.0.1:1", "llama", str(tmp_path), tmp_path / "x.jsonl")
    finally:
        sys.path.remove(str(SGLANG_SRC))
    assert (args.backend, args.warmup_requests, args.temperature) == ("sglang-oai", 0, 0.0)
    assert args.disable_ignore_eos is False and args.disable_stream is False  # ignore_eos on, streamed


@pytest.mark.parametrize(
    ("elapsed_s", "span_s", "drain_s", "deadline_s", "starts"),
    [
        (100.0, 94.0, 0.0, 0.0, True),  # no deadline
        (100.0, 94.0, 0.0, 200.0, True),  # the first rate: no drain measured yet, 194 <= 200
        (100.0, 94.0, 10.0, 200.0, False),  # 204 > 200: the last rate drained for 10 s
        (400.0, 16.0, 40.0, 456.0, True),  # exactly at the deadline
        (400.0, 16.0, 40.1, 456.0, False),
    ],
)
def test_a_rate_starts_only_if_its_arrivals_and_drain_end_in_time(
    elapsed_s: float, span_s: float, drain_s: float, deadline_s: float, starts: bool
) -> None:
    assert starts_in_time(elapsed_s, span_s, drain_s, deadline_s) is starts


def test_the_first_rate_is_admitted_by_a_warm_pass_not_by_the_compiling_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up's first pass carries the server's cold JIT; its drain once skipped SGLang's 1 req/s rate
    (110 s estimated drain). The estimate is the second pass's, under a salt of its own."""
    import argparse
    import time
    from types import SimpleNamespace

    from bench.serving import serving_sweep

    salts: list[int] = []

    def rows(serving: object, reqs: list, arrivals: list, vocab: int, salt: int) -> list:
        salts.append(salt)
        return [SimpleNamespace(output_len=100) for _ in reqs]

    def run(serving: object, bargs: object, rows: list) -> dict:
        time.sleep(0.3 if len(salts) == 1 else 0.0)  # the first pass compiles
        assert all(r.output_len == 16 for r in rows)
        return {"requests": [{"ok": True}] * len(rows)}

    monkeypatch.setattr(serving_sweep, "dataset_rows", rows)
    monkeypatch.setattr(serving_sweep, "run_rate", run)
    args = argparse.Namespace(warmup_requests=2, plain_vocab=100, system="s")
    drain_s = serving_sweep._warm_up(None, argparse.Namespace(), [object()] * 4, args, time.monotonic())
    assert len(salts) == serving_sweep.WARMUP_PASSES == 2 and len(set(salts)) == 2
    assert drain_s < 0.1
