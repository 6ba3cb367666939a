"""Greedy decoding with the KV cache compressed vs uncompressed, token for token, on the reference engine.

The model is Llama-3.1-8B-shaped (bench/configs/llama31_8b.json) with seeded random weights (no weights
exist on the GPU machine). Both runs use the same engine, the same requests, the same Triton kernels:
the compressed run stores full pages in zipkv's format and decodes with the fused kernel reading
them; the other run keeps every page raw and uses the kernel's uncompressed twin. The claim checked:
identical greedy tokens.

    python -m bench.serving.reference_engine_gpu --out bench/results/reference_engine_gpu.json  # GPU machine
    python -m bench.serving.reference_engine_gpu --device cpu --layers 1 --requests 2 --max-new 4 # smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from bench.paths import CONFIGS
from zipkv.worker.engine import EngineRequest, SamplingOptions
from zipkv.worker.engines.reference.engine import ReferenceEngine, ReferenceEngineConfig
from zipkv.worker.engines.reference.model import LoadedModel, build_model


def requests(n: int, vocab: int, max_new: int, seed: int = 0) -> list[EngineRequest]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(100, 1000, (1,), generator=g))
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        out.append(
            EngineRequest(f"r{i}", tuple(ids), SamplingOptions(max_new_tokens=max_new, ignore_eos=True))
        )
    return out


def run(
    loaded: LoadedModel, reqs: list[EngineRequest], compression: bool, budget: int, device: str, kernels: str
) -> dict[str, Any]:
    config = ReferenceEngineConfig(
        kv_budget_bytes=budget, compression=compression, kernels=kernels, chunk_bytes=2 << 20
    )
    engine = ReferenceEngine(loaded, config, device)
    for r in reqs:
        engine.add_request(r)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    ratios, compressed_pages, fused_steps = [], 0, 0
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_work():
        running_decode = (
            engine.store.decode_on_device
            and all(r.computed_tokens > 0 for r in engine._running.values())
            and not engine._queue
        )
        for event in engine.step():
            tokens[event.request_id].extend(event.token_ids)
        fused_steps += int(running_decode)
        stats = engine.store.stats()
        compressed_pages = max(compressed_pages, stats.compressed_pages)
        if stats.compressed_pages:
            ratios.append(stats.compression_ratio)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {
        "compression": compression,
        "tokens": tokens,
        "wall_s": round(time.perf_counter() - start, 3),
        "steps": engine.steps,
        "fused_decode_steps": fused_steps,
        "max_compressed_pages": compressed_pages,
        "compression_ratio_min": round(min(ratios), 4) if ratios else 1.0,
        "itl_ms": round(engine.capacity().itl_ms, 3),
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(CONFIGS / "llama31_8b.json"))
    p.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (0 = as in the config)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--kv-budget-gib", type=float, default=4.0)
    p.add_argument(
        "--kernels", default="auto", help="auto | triton | torch (triton on CPU needs TRITON_INTERPRET=1)"
    )
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def _model_config(path: str, layers: int) -> PretrainedConfig:
    """A model folder's config.json, or a bare JSON of config fields (bench/configs/); `layers` overrides
    the layer count when not 0."""
    config = (
        AutoConfig.from_pretrained(str(Path(path).parent), local_files_only=True)
        if Path(path).name == "config.json"
        else AutoConfig.for_model(**json.loads(Path(path).read_text()))
    )
    if layers:
        config.num_hidden_layers = layers
    return config


def _versions() -> dict[str, str]:
    versions = {"torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        import triton

        versions["triton"] = triton.__version__
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:
        pass
    return versions


def _print_table(on: dict[str, Any], off: dict[str, Any], identical: bool) -> None:
    print("\n| run | wall s | steps | fused decode steps | min ratio | ITL ms |\n|---|---|---|---|---|---|")
    for name, r in (("compressed", on), ("uncompressed", off)):
        print(
            f"| {name} | {r['wall_s']} | {r['steps']} | {r['fused_decode_steps']} | "
            f"{r['compression_ratio_min']} | {r['itl_ms']} |"
        )
    print(f"identical greedy tokens: {identical}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    config = _model_config(args.config, args.layers)
    t0 = time.perf_counter()
    loaded = build_model(config, "llama31-8b-shape-random", args.device)
    build_s = time.perf_counter() - t0
    reqs = requests(args.requests, loaded.vocab_size, args.max_new)
    budget = int(args.kv_budget_gib * (1 << 30))
    warm = run(loaded, reqs[:1], True, budget, args.device, args.kernels)  # JIT-compiles the kernels
    on = run(loaded, reqs, True, budget, args.device, args.kernels)
    off = run(loaded, reqs, False, budget, args.device, args.kernels)
    identical = on["tokens"] == off["tokens"]
    result = {
        "benchmark": "reference engine: greedy tokens, KV compressed vs uncompressed",
        "model": f"Llama-3.1-8B shape, random weights (seed fixed), {loaded.num_layers} layers",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "versions": _versions(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "command": "python -m bench.serving.reference_engine_gpu "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "requests": [
            {"prompt_tokens": len(r.prompt_token_ids), "max_new_tokens": args.max_new} for r in reqs
        ],
        "identical_tokens": identical,
        "build_s": round(build_s, 2),
        "warmup_s": warm["wall_s"],
        "compressed": {k: v for k, v in on.items() if k != "tokens"},
        "uncompressed": {k: v for k, v in off.items() if k != "tokens"},
        "first_tokens": {rid: toks[:8] for rid, toks in on["tokens"].items()},
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    _print_table(on, off, identical)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
