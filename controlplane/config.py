"""The router's one config: a YAML file plus `ZIPKV_*` environment overrides, validated at start-up.

Environment overrides name a key path with double underscores, e.g. `ZIPKV_HTTP__PORT=8080`,
`ZIPKV_STATE__REDIS_URL=redis://redis:6379/0`, `ZIPKV_SECURITY__REPORT_TOKEN=...`. Values are parsed as
YAML scalars (so `8080` is an int, `true` a bool, `[a, b]` a list). Unknown keys, in the file or in the
environment, are errors: a typo must not silently fall back to a default.

Check a file without starting anything: `python -m zipkv.controlplane.config --check FILE`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from zipkv.controlplane.grpc_keepalive import MIN_PING_INTERVAL_MS
from zipkv.controlplane.placement_config import PlacementConfig
from zipkv.controlplane.security_config import GrpcTlsConfig, SecurityConfig, Strict

ENV_PREFIX = "ZIPKV_"


class ConfigError(ValueError):
    """The config is invalid; the message names the key and what to do."""


__all__ = ["ConfigError", "GrpcTlsConfig", "PlacementConfig", "RouterConfig", "SecurityConfig", "load_config"]


class HttpConfig(Strict):
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=0, le=65535)
    max_request_bytes: int = Field(default=1 << 20, gt=0, description="larger bodies get 413")
    max_prompt_messages: int = Field(default=1024, gt=0)


class GrpcConfig(Strict):
    host: str = "0.0.0.0"
    port: int = Field(default=50051, ge=0, le=65535, description="ControlPlane.ReportCapacity listens here")


class ModelConfig(Strict):
    name: str = Field(min_length=1)
    tokenizer: str = Field(default="byte", description="`byte` (built-in) or a folder holding tokenizer.json")
    chat_template: str = Field(default="", description="a named template of the tokenizer, or a .jinja file")
    max_context_tokens: int = Field(default=2048, gt=0)
    # Prior for the TTFT prediction: prefill cost per prompt token on one worker.
    prefill_ms_per_token: float = Field(default=0.05, ge=0)
    default_max_tokens: int = Field(default=256, gt=0)


class StateConfig(Strict):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    key_prefix: str = "zipkv"
    refresh_ms: int = Field(default=50, gt=0, description="how often a router reloads the shared snapshot")
    redis_timeout_ms: int = Field(default=500, gt=0)

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StateConfig:
        if self.backend == "redis" and not self.redis_url:
            raise ValueError(
                "state.backend is 'redis' but state.redis_url is empty: set it (redis://host:6379/0)"
            )
        return self


class SloConfig(Strict):
    ttft_ms: float = Field(default=2000.0, gt=0)
    tpot_ms: float = Field(default=100.0, gt=0)


class LimitsConfig(Strict):
    requests_per_s: float = Field(default=0.0, ge=0, description="token-bucket rate per API key (0 = off)")
    burst: int = Field(default=100, gt=0)
    max_inflight_requests: int = Field(default=0, ge=0, description="429 beyond this many (0 = off)")
    retry_after_s: int = Field(default=1, gt=0)


class DispatchConfig(Strict):
    deadline_s: float = Field(default=600.0, gt=0, description="gRPC deadline of one Generate call")
    connect_timeout_s: float = Field(default=2.0, gt=0)
    retries: int = Field(default=1, ge=0, le=3, description="retries elsewhere before any token was sent")
    mid_request_retries: int = Field(default=1, ge=0, le=3)  # a request's, after a worker loss mid-generation
    resume_streams: bool = True  # a stream whose worker is lost goes on from its tokens on another worker
    unreachable_cooldown_s: float = Field(default=5.0, ge=0)  # a worker refusing connections goes last
    # ping workers this often while calls are open; no answer in keepalive_timeout_s: the worker is lost
    keepalive_s: float = Field(default=10.0, ge=MIN_PING_INTERVAL_MS / 1000)
    keepalive_timeout_s: float = Field(default=5.0, gt=0)


class TelemetryConfig(Strict):
    service_name: str = "zipkv-router"
    otlp_endpoint: str | None = Field(
        default=None, description="else the standard OTEL_EXPORTER_OTLP_* variables"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class RouterConfig(Strict):
    http: HttpConfig = HttpConfig()
    grpc: GrpcConfig = GrpcConfig()
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    state: StateConfig = StateConfig()
    placement: PlacementConfig = PlacementConfig()
    slo: SloConfig = SloConfig()
    limits: LimitsConfig = LimitsConfig()
    dispatch: DispatchConfig = DispatchConfig()
    # Secure by default: a config without a `security:` section has no report credential and is refused
    # below, unless it says `allow_unauthenticated_reports: true` explicitly.
    security: SecurityConfig = SecurityConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

    @model_validator(mode="after")
    def _unique_models(self) -> RouterConfig:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"models: duplicate names {dupes}")
        sec = self.security
        if sec.reports_open() and not sec.allow_unauthenticated_reports:
            raise ValueError(
                "security.report_token is empty: anyone reaching the report port could register a worker "
                "and receive users' prompts. Set it (env ZIPKV_SECURITY__REPORT_TOKEN, e.g. from "
                "`openssl rand -hex 32`), or security.worker_tokens / security.tls, or set "
                "security.allow_unauthenticated_reports: true for local development only"
            )
        return self

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{ENV_PREFIX}{'__'.join(path).upper()}: '{key}' is not a section")
        node = child
    node[path[-1]] = value


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"{name}: empty key segment (use ZIPKV_SECTION__KEY)")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"{name}: not a YAML scalar: {exc}") from exc
        _set_path(tree, path, value)
    return tree


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"invalid router config ({source}):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)


def load_config(path: str | None, env: Mapping[str, str] | None = None) -> RouterConfig:
    """Load and validate the router config; raise ConfigError with every problem listed."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    source = "defaults"
    if path:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data, source = loaded, str(path)
    overrides = _env_overrides(env)
    if overrides:
        data = _merge(data, overrides)
        source += " + ZIPKV_* env"
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zipkv.controlplane.config")
    parser.add_argument("--check", metavar="FILE", required=True, help="validate FILE (+ ZIPKV_* env)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.check, os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"ok: {args.check}: models {[m.name for m in cfg.models]}, state {cfg.state.backend}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
