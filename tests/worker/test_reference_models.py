"""Architectures and checkpoints: a Qwen2 checkpoint directory (q/k/v biases) and a Qwen3 config run
through the paged engine exactly like the tiny Llama."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

from zipkv.worker.engine import EngineRequest, SamplingOptions
from zipkv.worker.engines.reference.engine import ReferenceEngine, ReferenceEngineConfig
from zipkv.worker.engines.reference.model import LoadedModel, load_model


def _shape() -> dict[str, int]:
    return dict(
        vocab_size=300,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
    )


def _greedy(loaded: LoadedModel, prompt: tuple[int, ...], n: int, compression: bool = True) -> list[int]:
    engine = ReferenceEngine(loaded, ReferenceEngineConfig(compression=compression), "cpu")
    engine.add_request(EngineRequest("a", prompt, SamplingOptions(max_new_tokens=n, ignore_eos=True)))
    out: list[int] = []
    while engine.has_work():
        for e in engine.step():
            out.extend(e.token_ids)
    return out


@pytest.mark.parametrize("config_cls", [Qwen2Config, Qwen3Config])
def test_checkpoint_directory_loads_and_decodes_exactly(tmp_path: Path, config_cls: type) -> None:
    torch.manual_seed(0)
    config = config_cls(**_shape(), initializer_range=0.2, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "cpu")
    assert loaded.name == tmp_path.name and loaded.num_kv_heads == 2 and loaded.vocab_size == 300
    # The loaded weights are the saved ones.
    saved = dict(model.named_parameters())
    for name, param in loaded.model.named_parameters():
        assert torch.equal(param, saved[name]), name
    prompt = tuple(torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist())
    decoded = _greedy(loaded, prompt, 8)
    assert decoded == _greedy(loaded, prompt, 8, compression=False)
    seq = list(prompt)
    for _ in range(8):  # every token from a fresh prefill of the whole sequence
        seq.append(_greedy(loaded, tuple(seq), 1)[0])
    assert decoded == seq[len(prompt) :]


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="not supported"):
        load_model(str(tmp_path), "cpu")
