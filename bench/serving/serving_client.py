"""The serving sweep's client: SGLang 0.5.17's bench_serving (`sglang.benchmark.serving`) on the trace.

bench_serving is the client; this module only feeds it. Per rate it builds bench_serving `DatasetRow`s from
the Mooncake trace (trace_workload.py: token-id prompts, output lengths, arrival times scaled to the rate;
prompts salted per rate so no rate reuses another's cached prefixes), runs bench_serving's own
`benchmark()` against an OpenAI /v1/completions endpoint (backend `sglang-oai`: `prompt` is the id list,
`max_tokens` the trace's output, `ignore_eos`, temperature 0, streamed) and saves every request's TTFT,
inter-chunk gaps, output length, error, start and latency. In front of SGLang's gateway the backend is
`sglang` instead (POST /generate with `input_ids`, the same sampling, streamed): sglang-router 0.3.2
refuses a token-id `prompt` on /v1/completions but forwards /generate's `input_ids`, and routes on them
(its cache-aware tree keys on the ids as text).

Two things bench_serving 0.5.17 cannot do from its command line, done here through its library API:
- a dataset of token-id prompts with given output lengths and arrival times read from a file: its
  `mooncake` loader builds text prompts through a tokenizer instead, so the rows are built here;
- replaying those arrival times: `benchmark()` takes `use_trace_timestamps` but does not pass it on to
  its `get_request`, so that function is bound with `use_trace_timestamps=True` (its own replay code).
Its arguments come from its own parser (`cli_main` with a capturing `run_benchmark`), so every default is
bench_serving's. On a CPU-only machine `sglang.srt` cannot be imported (its utilities need a CUDA
torchvision); there the two server-side modules bench_serving imports, for a constant and URL helpers,
are supplied (`_cpu_import_shim`): the constant's value, and `sglang/srt/utils/network.py` loaded from
the same wheel, with the `sglang` package entered without its `__init__` (which imports `sglang.srt`).
The benchmark code itself is unchanged. Where Hugging Face `datasets` is not installed (the GPU machine's
image), a named stand-in takes its place: bench_serving imports it only for a loader the sweep does not use.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from bench.serving.trace_workload import TraceRequest, prompt_token_ids

BACKEND = "sglang-oai"  # /v1/completions with the id list as `prompt`: zipkv's router, SGLang's server
GATEWAY_BACKEND = "sglang"  # /generate with `input_ids`: what SGLang's gateway forwards for token ids
API_PATHS = {BACKEND: "/v1/completions", GATEWAY_BACKEND: "/generate"}
SHED_REASONS = ("Service Unavailable", "Too Many Requests")


def _cpu_import_shim() -> None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not importable: put SGLang 0.5.17's wheel source on PYTHONPATH")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]  # what the failed import left half-initialised
    package = types.ModuleType("sglang")  # the package without its __init__ (which imports sglang.srt)
    package.__path__ = [str(root)]
    sys.modules["sglang"] = package
    disagg = types.ModuleType("sglang.srt.disaggregation.utils")
    disagg.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # type: ignore[attr-defined]  # sglang/srt/disaggregation/utils.py
    sys.modules[disagg.__name__] = disagg
    net_spec = importlib.util.spec_from_file_location(
        "sglang.srt.utils.network", root / "srt/utils/network.py"
    )
    assert net_spec is not None and net_spec.loader is not None
    network = importlib.util.module_from_spec(net_spec)
    sys.modules[net_spec.name] = network
    net_spec.loader.exec_module(network)


def _stand_in_for_datasets() -> None:
    """A named stand-in for Hugging Face `datasets` where it is not installed (the GPU machine's image).

    bench_serving 0.5.17 imports it at module level only for its MMMU loader (`datasets/mmmu.py`), which the
    sweep never calls: its rows are built here from the trace. Calling the stand-in says what is missing.
    """
    try:
        import datasets  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("datasets")
        stand_in.__doc__ = "stand-in: Hugging Face datasets is not installed (bench_serving's MMMU loader)"

        def load_dataset(*args: Any, **kwargs: Any) -> Any:
            raise ImportError("Hugging Face `datasets` is not installed: pip install datasets")

        stand_in.load_dataset = load_dataset  # type: ignore[attr-defined]
        sys.modules["datasets"] = stand_in


def import_bench_serving() -> tuple[Any, bool]:
    """(sglang.benchmark.serving, whether the CPU import shim was needed)."""
    _stand_in_for_datasets()
    try:
        import sglang.benchmark.serving as serving

        return serving, False
    except (ImportError, RuntimeError, ValueError):
        _cpu_import_shim()
        import sglang.benchmark.serving as serving

        return serving, True


def bench_args(
    serving: Any, base_url: str, model: str, tokenizer: str, out_file: Path, backend: str = BACKEND
) -> argparse.Namespace:
    """bench_serving's own parsed arguments (its defaults), for one run against `base_url`."""
    if backend not in API_PATHS:
        raise ValueError(f"backend {backend!r}: one of {sorted(API_PATHS)}")
    captured: list[argparse.Namespace] = []
    argv = [
        "bench_serving",
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--warmup-requests",
        "0",
        "--ready-check-timeout-sec",
        "0",
        "--disable-tqdm",
        "--output-file",
        str(out_file),
    ]
    real_run, real_argv = serving.run_benchmark, sys.argv
    try:
        serving.run_benchmark, sys.argv = captured.append, argv
        serving.cli_main()
    finally:
        serving.run_benchmark, sys.argv = real_run, real_argv
    return captured[0]


def dataset_rows(
    serving: Any, requests: list[TraceRequest], arrivals_s: list[float], plain_vocab: int, salt: int
) -> list[Any]:
    return [
        serving.DatasetRow(
            prompt=prompt_token_ids(r, plain_vocab, salt=salt),
            prompt_len=r.input_tokens,
            output_len=r.output_tokens,
            timestamp=t * 1000.0,  # bench_serving's trace timestamps are milliseconds
        )
        for r, t in zip(requests, arrivals_s, strict=True)
    ]


def run_rate(serving: Any, args: argparse.Namespace, rows: list[Any]) -> dict[str, Any]:
    """One bench_serving run over `rows` at their arrival times; bench_serving's summary and per request."""
    serving.set_global_args(args)
    index = {id(r.prompt): i for i, r in enumerate(rows)}
    per: list[dict[str, Any] | None] = [None] * len(rows)
    backend = str(args.backend)
    real_func = serving.ASYNC_REQUEST_FUNCS[backend]
    real_get = serving.get_request

    async def recorded(request_func_input: Any, pbar: Any = None) -> Any:
        out = await real_func(request_func_input=request_func_input, pbar=pbar)
        per[index[id(request_func_input.prompt)]] = {
            "ok": bool(out.success) and out.ttft > 0,
            "shed": (out.error or "").startswith(SHED_REASONS),
            "ttft_s": out.ttft,
            "itl_s": list(out.itl),
            "output_tokens": out.output_len,
            "start_s": out.start_time,
            "latency_s": out.latency,
            "error": (out.error or "")[-300:],
        }
        return out

    tokenizer = serving.get_tokenizer(args.tokenizer)
    serving.ASYNC_REQUEST_FUNCS[backend] = recorded
    serving.get_request = functools.partial(real_get, use_trace_timestamps=True, slowdown_factor=1.0)
    try:
        result = asyncio.run(
            serving.benchmark(
                backend=backend,
                api_url=f"{args.base_url}{API_PATHS[backend]}",
                base_url=args.base_url,
                model_id=args.model,
                tokenizer=tokenizer,
                input_requests=rows,
                request_rate=float("inf"),
                max_concurrency=None,
                disable_tqdm=True,
                lora_names=None,
                lora_request_distribution=None,
                lora_zipf_alpha=None,
                extra_request_body={},
                profile=False,
            )
        )
    finally:
        serving.ASYNC_REQUEST_FUNCS[backend], serving.get_request = real_func, real_get
    t0 = min((rec["start_s"] for rec in per if rec is not None), default=0.0)
    for rec in per:
        if rec is not None:
            rec["start_s"] = round(rec["start_s"] - t0, 4)
    summary = {k: v for k, v in result.items() if isinstance(v, int | float | str)}
    return {"bench_serving": summary, "requests": per}
