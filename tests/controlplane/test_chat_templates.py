"""Chat templates found where transformers keeps them and rendered as transformers renders them: the
router's token ids equal `apply_chat_template`'s for SmolLM2's real template and for named templates; a
model without one gets a 400 that names the fix; stop tokens come from generation_config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from router_harness import stack

from zipkv.controlplane.chat_template import NoChatTemplate
from zipkv.controlplane.tokenizer import HFTokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": 'Another, with <b>markup</b> & "quotes".'},
    ],
    [{"role": "user", "content": "Zürich, 東京 and emoji 🙂\nover two lines"}],
]

# A template in the style of Qwen's: namespace, loop controls, tojson, raise_exception, bos_token.
RICH_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(turns=0) %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "{% if m['role'] == 'system' %}<|im_start|>system\n{{ m['content'] | trim }}<|im_end|>\n{% continue %}"
    "{% endif %}{% set ns.turns = ns.turns + 1 %}"
    "<|im_start|>{{ m['role'] }} {{ ns.turns }}\n{{ m['content'] }}<|im_end|>\n"
    "{% if loop.index > 8 %}{% break %}{% endif %}{% endfor %}"
    "{% if tools is not none %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _transformers_ids(folder: Path, messages: list[dict[str, str]], **kw: object) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    out = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kw
    )
    return [int(i) for i in out]


def _folder_with(src: Path, dst: Path, *, jinja: str | None, config_template: object = None) -> Path:
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if config_template is not None:
        config["chat_template"] = config_template
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (dst / "chat_template.jinja").write_text(jinja)
    return dst


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_smollm2_chat_template_matches_transformers(smollm2_dir: Path, conversation: int) -> None:
    """SmolLM2's template lives in chat_template.jinja (as current transformers saves it)."""
    assert (smollm2_dir / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    messages = CONVERSATIONS[conversation]
    ours = HFTokenizer(smollm2_dir).chat_ids(messages)
    assert ours == _transformers_ids(smollm2_dir, messages)
    assert len(ours) > 30  # the template's system prompt is there (the old generic format had ~12)


def test_named_templates_in_tokenizer_config_and_files(smollm2_dir: Path, tmp_path: Path) -> None:
    named = [{"name": "default", "template": RICH_TEMPLATE}, {"name": "plain", "template": "{{ messages }}"}]
    in_config = _folder_with(smollm2_dir, tmp_path / "config", jinja=None, config_template=named)
    in_files = _folder_with(smollm2_dir, tmp_path / "files", jinja=RICH_TEMPLATE)
    (in_files / "additional_chat_templates").mkdir()
    (in_files / "additional_chat_templates" / "terse.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    )
    for folder in (in_config, in_files):
        for messages in CONVERSATIONS:
            assert HFTokenizer(folder).chat_ids(messages) == _transformers_ids(folder, messages), folder.name
    messages = CONVERSATIONS[1]
    terse = HFTokenizer(in_files, chat_template="terse").chat_ids(messages)
    assert terse == _transformers_ids(in_files, messages, chat_template="terse")
    with pytest.raises(ValueError, match=r"no template of that name .*\['default', 'terse'\]"):
        HFTokenizer(in_files, chat_template="missing")


def test_named_templates_without_a_default_must_be_chosen(smollm2_dir: Path, tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": RICH_TEMPLATE}, {"name": "rag", "template": "{{ messages }}"}]
    folder = _folder_with(smollm2_dir, tmp_path / "t", jinja=None, config_template=named)
    with pytest.raises(ValueError, match=r"\['rag', 'tool_use'\] and none is the default"):
        HFTokenizer(folder)
    chosen = HFTokenizer(folder, chat_template="tool_use")
    assert chosen.chat_ids(CONVERSATIONS[0]) == _transformers_ids(
        folder, CONVERSATIONS[0], chat_template="tool_use"
    )
    own = tmp_path / "own.jinja"
    own.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    assert HFTokenizer(folder, chat_template=str(own)).apply_chat_template(CONVERSATIONS[0]) == (
        "[user] What is the capital of France?\n"
    )


def test_stop_tokens_come_from_generation_config(smollm2_dir: Path, tmp_path: Path) -> None:
    assert HFTokenizer(smollm2_dir).stop_token_ids == (2,)  # <|im_end|>, also generation_config's
    folder = _folder_with(smollm2_dir, tmp_path / "g", jinja=RICH_TEMPLATE)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2, 7]}))
    assert HFTokenizer(folder).stop_token_ids == (2, 0, 7)


def test_a_model_without_a_template_gets_a_400_naming_the_fix(smollm2_dir: Path, tmp_path: Path) -> None:
    folder = _folder_with(smollm2_dir, tmp_path / "none", jinja=None)
    with pytest.raises(NoChatTemplate):
        HFTokenizer(folder).chat_ids(CONVERSATIONS[0])
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    models = [{"name": "plain", "tokenizer": str(folder), "max_context_tokens": 4096}]
    with stack(models=models) as s:
        worker = s.add_worker(model="plain")
        body = {"model": "plain", "messages": CONVERSATIONS[0], "max_tokens": 4}
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "chat_template_missing" and error["param"] == "messages"
        assert "chat_template.jinja" in error["message"] and "/v1/completions" in error["message"]
        assert not worker.seen.requests  # nothing was sent on
        r = httpx.post(
            f"{s.url}/v1/completions", json={"model": "plain", "prompt": "Hi", "max_tokens": 4}, timeout=10
        )
        assert r.status_code == 200, r.text
        assert list(worker.seen.requests[-1].sampling.stop_token_ids) == [2, 7]  # EOS + generation config
