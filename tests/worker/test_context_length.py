"""Context length from the model's config (max_position_embeddings, sliding windows), overridable with
`zipkv up --max-context-tokens`, checked against the KV budget at start-up with a message that says what
to change; a GGUF file or a folder holding one is served through its dequantized folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from smollm2 import smollm2_gguf

from zipkv.stack.cli import parser
from zipkv.stack.local_stack import LocalStack
from zipkv.stack.options import StackOptions
from zipkv.worker.checkpoint import model_shape, read_config, resolve_context
from zipkv.worker.engine_factory import build_engine
from zipkv.worker.settings import WorkerSettings


def _stack(argv: list[str]) -> LocalStack:
    args = parser().parse_args(["up", *argv])
    options = StackOptions(
        model_path=args.model,
        kv_budget_mib=args.kv_budget_mib,
        max_context_tokens=args.max_context_tokens,
        chat_template=args.chat_template,
    )
    stack = LocalStack(options, progress=lambda line: None)
    stack.prepare_model()
    return stack


def _router_model(stack: LocalStack) -> dict[str, object]:
    return json.loads(stack._router_config(0).read_text())["models"][0]  # type: ignore[no-any-return]


def test_zipkv_up_serves_the_models_own_context(smollm2_dir: Path) -> None:
    stack = _stack(["--model", str(smollm2_dir), "--kv-budget-mib", "256"])
    assert _router_model(stack)["max_context_tokens"] == 8192  # SmolLM2's max_position_embeddings
    assert stack.replica_args(["127.0.0.1:1"], 1)["max_context_tokens"] == 8192
    tiny = _stack([])
    assert _router_model(tiny)["max_context_tokens"] == 2048 and _router_model(tiny)["tokenizer"] == "byte"


def test_max_context_tokens_overrides_within_the_model(smollm2_dir: Path) -> None:
    stack = _stack(
        ["--model", str(smollm2_dir), "--max-context-tokens", "2600", "--chat-template", "x.jinja"]
    )
    model = _router_model(stack)
    assert (model["max_context_tokens"], model["chat_template"]) == (2600, "x.jinja")
    assert stack.replica_args(["127.0.0.1:1"], 1)["max_context_tokens"] == 2600
    with pytest.raises(
        ValueError, match=r"exceeds the model's context of 8192 tokens.*max_position_embeddings"
    ):
        _stack(["--model", str(smollm2_dir), "--max-context-tokens", "9000", "--kv-budget-mib", "512"])


def test_a_budget_too_small_for_the_context_is_refused_saying_what_fits(smollm2_dir: Path) -> None:
    with pytest.raises(ValueError) as info:
        _stack(["--model", str(smollm2_dir)])  # 64 MiB by default: 2688 tokens of SmolLM2's KV
    message = str(info.value)
    assert "64 MiB holds 2688 tokens" in message and "context of 8192" in message
    assert "--max-context-tokens" in message
    suggested = int(message.split("at least ")[1].split(" MiB")[0])
    _stack(["--model", str(smollm2_dir), "--kv-budget-mib", str(suggested)])  # the suggestion fits
    with pytest.raises(ValueError, match="fewer than one request"):
        _stack(["--model", str(smollm2_dir), "--kv-budget-mib", str(suggested - 1)])  # and is the least
    assert (
        _router_model(_stack(["--model", str(smollm2_dir), "--max-context-tokens", "2688"]))[
            "max_context_tokens"
        ]
        == 2688
    )


def test_sliding_windows_bound_the_context() -> None:
    base = {
        "num_attention_heads": 8,
        "num_hidden_layers": 2,
        "hidden_size": 512,
        "max_position_embeddings": 32768,
    }
    mistral = model_shape({**base, "sliding_window": 4096})
    assert (mistral.context_tokens, mistral.sliding_window_tokens) == (4096, 4096)
    with pytest.raises(ValueError, match="sliding window of 4096"):
        resolve_context(mistral, 8192)
    assert resolve_context(mistral, 1024) == 1024
    qwen_off = model_shape({**base, "sliding_window": 4096, "use_sliding_window": False})
    assert qwen_off.context_tokens == 32768
    full_layers = model_shape({**base, "sliding_window": 4096, "layer_types": ["full_attention"] * 2})
    assert full_layers.context_tokens == 32768


def test_worker_settings_carry_the_context_to_the_engine() -> None:
    engine = build_engine(WorkerSettings(device="cpu", max_context_tokens=1024))
    assert engine.capacity().max_context_tokens == 1024
    with pytest.raises(ValueError, match="holds 1536 tokens"):
        build_engine(WorkerSettings(device="cpu", kv_budget_bytes=2 << 20))  # the tiny model: 2048 context


def test_a_gguf_file_or_its_folder_is_served_through_its_dequantized_folder(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zipkv.worker.engines.reference.gguf_import import gguf_file, resolve_model_path

    gguf = smollm2_gguf()
    assert gguf_file(gguf.parent) == gguf  # the package's folder holds it, with no config.json
    assert resolve_model_path(str(gguf), cache_dir=smollm2_dir.parents[1]) == str(smollm2_dir)
    monkeypatch.setenv("ZIPKV_CACHE_DIR", str(smollm2_dir.parents[1]))
    stack = _stack(["--model", str(gguf.parent), "--kv-budget-mib", "256"])
    assert stack.model_path == str(smollm2_dir) and _router_model(stack)["tokenizer"] == str(smollm2_dir)
    assert LocalStack(StackOptions(model_path=str(gguf))).model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert read_config(smollm2_dir)["max_position_embeddings"] == 8192
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(gguf, two / name) if name == "a.gguf" else (two / name).write_bytes(b"")
    with pytest.raises(ValueError, match="holds 2 GGUF files"):
        gguf_file(two)
