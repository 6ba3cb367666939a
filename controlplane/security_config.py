"""The router config's `security` section: report credentials, per-worker tokens, gRPC mutual TLS, API
keys. Secure by default: an empty or placeholder secret is refused at start-up (see RouterConfig)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zipkv.controlplane.grpc_auth import TlsFiles

# A worker identity (certificate CN or per-worker token name); worker ids are `<identity>[/<replica>]`.
IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Values that appear in examples and tutorials: a deployment that kept one is as open as one with none.
PLACEHOLDER_SECRETS = frozenset(
    {"change-me", "changeme", "change_me", "replace-me", "replaceme", "secret", "token", "password",
     "example", "test", "default", "none", "null", "xxx", "<token>", "<report-token>", "your-token-here"}
)  # fmt: skip
MIN_SECRET_CHARS = 16


def refuse_weak_secret(value: str, key: str) -> str:
    """A non-empty secret that is long enough and not a known placeholder, else ValueError naming `key`."""
    if value.strip().lower() in PLACEHOLDER_SECRETS:
        raise ValueError(
            f"{key} is the placeholder {value!r}: generate a real one (openssl rand -hex 32) and pass it "
            "from a Secret"
        )
    if len(value) < MIN_SECRET_CHARS:
        raise ValueError(
            f"{key} has {len(value)} characters, at least {MIN_SECRET_CHARS} are required "
            "(openssl rand -hex 32 makes one)"
        )
    return value


class GrpcTlsConfig(Strict):
    """Mutual TLS on every gRPC hop: the report server asks for a client certificate signed by `ca_file`,
    and the router dials workers with its own certificate, checking theirs against the same CA."""

    cert_file: str = Field(min_length=1, description="this router's certificate chain (PEM)")
    key_file: str = Field(min_length=1, description="its private key (PEM)")
    ca_file: str = Field(min_length=1, description="the CA that signed the workers' certificates (PEM)")
    worker_server_name: str = Field(
        default="zipkv-worker",
        min_length=1,
        description="the name the workers' certificates hold (workers are dialled by pod address)",
    )

    def files(self, peer_name: str = "") -> TlsFiles:
        return TlsFiles(self.cert_file, self.key_file, self.ca_file, peer_name)

    def check_readable(self) -> None:
        """At start-up (not at --check time, where the mounted files may be absent): fail loudly."""
        for key in ("cert_file", "key_file", "ca_file"):
            if not Path(getattr(self, key)).is_file():
                raise OSError(f"security.tls.{key}: {getattr(self, key)} is not a readable file")


class SecurityConfig(Strict):
    api_keys: tuple[str, ...] = Field(default=(), description="Bearer keys for the HTTP API (empty = open)")
    report_token: str = Field(default="", description="shared token workers send with ReportCapacity")
    allow_unauthenticated_reports: bool = Field(
        default=False, description="must be true to run with an empty report_token (local development only)"
    )
    # Per-worker tokens: identity -> token. A report carrying one of these may only name worker ids that
    # are the identity or start with `<identity>/` (a replica of it), so a token cannot speak for others.
    worker_tokens: dict[str, str] = Field(default_factory=dict)
    # The token the router sends with Worker.Generate / Abort (workers refuse calls without it).
    dispatch_token: str = Field(default="", description="bearer token for router -> worker calls")
    tls: GrpcTlsConfig | None = Field(default=None, description="mutual TLS on gRPC (production)")
    auth_failures_per_minute: int = Field(
        default=10, ge=0, description="failed API-key attempts per client address per minute (0 = off)"
    )

    @model_validator(mode="after")
    def _secrets(self) -> SecurityConfig:
        if self.report_token:
            refuse_weak_secret(self.report_token, "security.report_token")
        if self.dispatch_token:
            refuse_weak_secret(self.dispatch_token, "security.dispatch_token")
        for i, key in enumerate(self.api_keys):
            if not key or key.strip().lower() in PLACEHOLDER_SECRETS:
                raise ValueError(f"security.api_keys[{i}] is empty or a placeholder: generate real keys")
            if not key.isascii() or not key.isprintable() or " " in key:
                raise ValueError(f"security.api_keys[{i}] must be printable ASCII without spaces")
        for identity, token in self.worker_tokens.items():
            if not IDENTITY.fullmatch(identity):
                raise ValueError(
                    f"security.worker_tokens: identity {identity!r} must match {IDENTITY.pattern}"
                )
            refuse_weak_secret(token, f"security.worker_tokens.{identity}")
        return self

    def reports_open(self) -> bool:
        """No credential at all is configured for reports (only allowed when said explicitly)."""
        return not (self.report_token or self.worker_tokens or self.tls)
