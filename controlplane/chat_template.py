"""Chat templates, found and rendered as transformers finds and renders them (no torch, no transformers).

Where (transformers' order; the files win over the config):
  chat_template.jinja                     the template named `default`
  additional_chat_templates/NAME.jinja    further named templates
  tokenizer_config.json `chat_template`   a string (`default`), or a list of {"name", "template"}

Which: `models[].chat_template` when set (a template name, or the path of a .jinja file), else `default`;
a model with named templates and no `default` must name one (refused at start-up). A model with no
template at all has none: chat requests get a 400 naming the fix (never a silent generic format).

How: compiled once per model in jinja2's immutable sandbox with transformers' environment (trim_blocks,
lstrip_blocks, loop controls, its `tojson`, `raise_exception`, `strftime_now`), rendered with the
messages, `add_generation_prompt`, `tools=None`, `documents=None` and the tokenizer's special tokens
(bos/eos/unk/pad), then tokenized without adding special tokens (the template places them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
DEFAULT = "default"


class NoChatTemplate(ValueError):
    """The model has no chat template; the message says how to give it one."""


def find_chat_templates(folder: Path, tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """Every template of a tokenizer folder, by name (`default` for the unnamed one); {} when none."""
    templates: dict[str, str] = {}
    if (folder / CHAT_TEMPLATE_FILE).is_file():
        templates[DEFAULT] = (folder / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if (folder / CHAT_TEMPLATE_DIR).is_dir():
        for file in sorted((folder / CHAT_TEMPLATE_DIR).glob("*.jinja")):
            templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    if templates:
        return templates
    entry = tokenizer_config.get("chat_template")
    if isinstance(entry, str):
        return {DEFAULT: entry}
    if isinstance(entry, list):
        return {str(t["name"]): str(t["template"]) for t in entry if isinstance(t, dict)}
    return {}


def select_chat_template(templates: Mapping[str, str], choice: str, where: str) -> str | None:
    """The template to serve: ``choice`` (a name, or a .jinja file), else `default`; None when the model
    has none. Raises ValueError when ``choice`` names nothing, or when named templates lack a default."""
    if choice.endswith(".jinja"):
        path = Path(choice)
        if not path.is_file():
            raise ValueError(f"chat_template: {choice} is not a file")
        return path.read_text(encoding="utf-8")
    if choice:
        if choice not in templates:
            raise ValueError(
                f"chat_template {choice!r}: {where} has no template of that name (it has "
                f"{sorted(templates) or 'none'}); name one of them or give a .jinja file"
            )
        return templates[choice]
    if not templates:
        return None
    if DEFAULT not in templates:
        raise ValueError(
            f"{where} has chat templates {sorted(templates)} and none is the default: set the model's "
            "chat_template to one of these names"
        )
    return templates[DEFAULT]


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes HTML characters; transformers' does not (and takes these options)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One model's template, compiled once; `render` gives the prompt text."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def _raise(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc} (line {exc.lineno})") from None
        self._special = dict(special_tokens)

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        return self._template.render(
            messages=[dict(m) for m in messages],
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._special,
        )
