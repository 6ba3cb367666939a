"""Model loading for the reference engine: Hugging Face model definitions with zipkv's paged attention.

The attention of every layer is routed to `zipkv_paged_attention` (registered with transformers'
AttentionInterface), which writes the step's new K/V into our paged, compressed KV store and attends over
it. Everything else (embeddings, norms, rotary embedding, MLP, LM head) is transformers' own code, so any
architecture whose attention goes through the interface works: Llama, Qwen2, Qwen3, Mistral.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, LlamaConfig, PretrainedConfig
from transformers.masking_utils import AttentionMaskInterface

from zipkv.worker.checkpoint import model_shape
from zipkv.worker.engines.reference.attention import zipkv_paged_attention

ATTN_IMPLEMENTATION = "zipkv"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")

# The embedded default: a tiny Llama with the router's byte-level vocabulary (bytes 0-255, bos 256,
# eos 257, pad 258: zipkv.controlplane.tokenizer.ByteTokenizer). Small enough for tens of tokens per
# second on one CPU thread.
TINY_MODEL_NAME = "zipkv-tiny"
TINY_VOCAB = 259
TINY_BOS, TINY_EOS, TINY_PAD = 256, 257, 258
TINY_SEED = 1234


def _register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, zipkv_paged_attention)
    # Our attention function builds its own causal structure from the paged batch: no dense mask.
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, lambda *args, **kwargs: None)


_register()


@dataclass(frozen=True)
class LoadedModel:
    name: str
    model: torch.nn.Module  # a *ForCausalLM in eval mode, bf16
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_context_tokens: int


def tiny_config(num_layers: int = 2, hidden: int = 128, max_context_tokens: int = 2048) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_context_tokens,
        bos_token_id=TINY_BOS,
        eos_token_id=TINY_EOS,
        pad_token_id=TINY_PAD,
        # Larger than the usual 0.02 so that random weights give peaked, non-degenerate outputs.
        initializer_range=0.2,
        tie_word_embeddings=False,
    )


def _eos_ids(*configs: Any) -> tuple[int, ...]:
    """EOS ids of the model config and its generation config (generation_config.json), merged in order."""
    ids: list[int] = []
    for config in configs:
        eos = getattr(config, "eos_token_id", None)
        for i in eos if isinstance(eos, list | tuple) else ([] if eos is None else [eos]):
            if int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)


def build_model(config: PretrainedConfig, name: str, device: str, seed: int = TINY_SEED) -> LoadedModel:
    """A model from a config with random weights (seeded: every replica builds the same weights)."""
    config._attn_implementation = ATTN_IMPLEMENTATION
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        if device.startswith("cuda"):
            torch.cuda.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return _describe(model.eval(), name)


def load_checkpoint(path: str, device: str, name: str | None = None) -> LoadedModel:
    """A local Hugging Face checkpoint directory (config.json + safetensors), loaded in bf16."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"model path {path} has no config.json: give a local Hugging Face checkpoint directory, or no "
            "path for the built-in tiny model"
        )
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model type {config.model_type!r} not supported; use one of {SUPPORTED_MODEL_TYPES}"
        )
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    if not has_weights:
        # A config alone (e.g. a model shape for benchmarks) gets seeded random weights.
        return build_model(config, name or folder.name, device)
    model: Any = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, attn_implementation=ATTN_IMPLEMENTATION, local_files_only=True
    )
    return _describe(model.to(device).eval(), name or folder.name)


def load_model(path: str | None, device: str, name: str | None = None, **tiny: Any) -> LoadedModel:
    if path:
        return load_checkpoint(path, device, name)
    return build_model(tiny_config(**tiny), name or TINY_MODEL_NAME, device)


def _describe(model: torch.nn.Module, name: str) -> LoadedModel:
    cfg: Any = model.config
    shape = model_shape(cfg.to_dict())
    return LoadedModel(
        name=name,
        model=model,
        num_layers=shape.num_layers,
        num_q_heads=cfg.num_attention_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        vocab_size=cfg.vocab_size,
        eos_token_ids=_eos_ids(cfg, getattr(model, "generation_config", None)),
        max_context_tokens=shape.context_tokens,  # capped at an active sliding window (checkpoint.py)
    )


def describe_json(loaded: LoadedModel) -> str:
    return json.dumps({k: v for k, v in loaded.__dict__.items() if k != "model"})
