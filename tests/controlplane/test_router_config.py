"""Router config: file + ZIPKV_* env, strict validation, the --check command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zipkv.controlplane.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "controlplane" / "router.example.yaml"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "router.yaml"
    path.write_text(text)
    return str(path)


GOOD_TOKEN = "0123456789abcdef0123456789abcdef"
TOKEN_ENV = {"ZIPKV_SECURITY__REPORT_TOKEN": GOOD_TOKEN}


def test_example_config_loads_with_a_token_from_the_environment() -> None:
    cfg = load_config(str(EXAMPLE), TOKEN_ENV)
    assert cfg.models[0].name == "zipkv-tiny"
    assert cfg.security.report_token == GOOD_TOKEN
    with pytest.raises(ConfigError, match="report_token is empty"):
        load_config(str(EXAMPLE), {})  # the example holds no secret: it must be given


def test_no_security_section_refuses_unauthenticated_reports(tmp_path: Path) -> None:
    # Without a `security:` section the router used to accept anyone's reports (and send prompts to
    # whatever address they named). Now it refuses to start unless the operator opts out explicitly.
    with pytest.raises(ConfigError, match="report_token is empty"):
        load_config(_write(tmp_path, "models: [{name: m}]\n"), {})
    cfg = load_config(
        _write(tmp_path, "models: [{name: m}]\nsecurity: {allow_unauthenticated_reports: true}\n"), {}
    )
    assert cfg.security.reports_open() and cfg.security.allow_unauthenticated_reports


@pytest.mark.parametrize("token", ["change-me", "CHANGE-ME", "secret", "password", "short-token"])
def test_placeholder_and_short_report_tokens_are_refused(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigError, match="report_token"):
        load_config(_write(tmp_path, "models: [{name: m}]\n"), {"ZIPKV_SECURITY__REPORT_TOKEN": token})


@pytest.mark.parametrize("keys", ["[change-me]", "['']", "['k\u00e9y-0123456789abcdef']"])
def test_placeholder_or_non_ascii_api_keys_are_refused(tmp_path: Path, keys: str) -> None:
    env = {**TOKEN_ENV, "ZIPKV_SECURITY__API_KEYS": keys}
    with pytest.raises(ConfigError, match="api_keys"):
        load_config(_write(tmp_path, "models: [{name: m}]\n"), env)


def test_env_overrides_nested_keys(tmp_path: Path) -> None:
    env = {
        "ZIPKV_HTTP__PORT": "9123",
        "ZIPKV_STATE__BACKEND": "redis",
        "ZIPKV_STATE__REDIS_URL": "redis://r:6379/0",
        "ZIPKV_SECURITY__API_KEYS": "[k1, k2]",
        "UNRELATED": "x",
    }
    cfg = load_config(str(EXAMPLE), {**env, **TOKEN_ENV})
    assert cfg.http.port == 9123
    assert cfg.state.backend == "redis"
    assert cfg.security.api_keys == ("k1", "k2")
    assert cfg.http.host == "0.0.0.0"  # untouched keys keep the file's value


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        ("models: []\n", {}, "models"),
        ("models: [{name: m}]\nhttp: {prot: 1}\n", {}, "http.prot"),
        ("models: [{name: m}]\nstate: {backend: redis}\n", {}, "redis_url"),
        ("models: [{name: m}]\nsecurity: {report_token: ''}\n", {}, "report_token"),
        ("models: [{name: m}, {name: m}]\n", {}, "duplicate"),
        ("models: [{name: m}]\n", {"ZIPKV_HTTP__PORT": "99999"}, "http.port"),
        ("models: [{name: m}]\n", {"ZIPKV_NOPE__X": "1"}, "nope"),
        ("models: [{name: m, max_context_tokens: 0}]\n", {}, "max_context_tokens"),
        ("- just\n- a list\n", {}, "mapping"),
        ("models: [\n", {}, "not valid YAML"),
    ],
)
def test_invalid_configs_fail_loudly(tmp_path: Path, text: str, env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(_write(tmp_path, text), env)


def test_missing_file_is_an_error() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/router.yaml", {})


def test_check_command_exit_codes(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "zipkv.controlplane.config", "--check", str(EXAMPLE)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **TOKEN_ENV},
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "zipkv.controlplane.config", "--check", _write(tmp_path, "models: 3\n")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0
    assert "invalid router config" in bad.stderr and "models" in bad.stderr


def test_router_start_up_fails_loudly_on_a_bad_tokenizer(tmp_path: Path) -> None:
    text = "models: [{name: m, tokenizer: /nonexistent/tok}]\nsecurity: {report_token: 0123456789abcdef}\n"
    cfg = _write(tmp_path, text)
    out = subprocess.run(
        [sys.executable, "-m", "zipkv.controlplane", "--config", cfg],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 2
    assert "tokenizer.json" in out.stderr and "Traceback" not in out.stderr
