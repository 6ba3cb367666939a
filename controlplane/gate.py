"""The gate: what a request passes at the HTTP edge before the router takes it on: API keys, body size, JSON,
SLO headers, rate and in-flight limits. (Not admission, which is an engine starting a queued request:
docs/design.md, Words.)

Every refusal is an `HttpError` with an OpenAI-shaped body; no stack trace reaches a client.
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.grpc_auth import tokens_equal

SLO_TTFT_HEADER = "x-zipkv-slo-ttft-ms"
SLO_TPOT_HEADER = "x-zipkv-slo-tpot-ms"


class HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code
        self.param, self.retry_after_s = param, retry_after_s


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> HttpError:
    return HttpError(400, message, "invalid_request_error", code, param)


def check_api_key(request: Request, cfg: RouterConfig) -> str:
    """The caller's key ('' when keys are off); 401 when keys are on and it is missing or wrong.
    Compared as bytes: a key with non-ASCII characters is a wrong key (401), not an error."""
    if not cfg.security.api_keys:
        return ""
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if key and any(tokens_equal(key, k) for k in cfg.security.api_keys):
        return key
    raise HttpError(
        401,
        "missing or invalid API key: send `Authorization: Bearer <key>`",
        "authentication_error",
        "invalid_api_key",
    )


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_media_type(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise HttpError(
            415,
            f"content-type {media or '(none)'!r} is not supported: send a JSON body with "
            "`Content-Type: application/json`",
            "invalid_request_error",
            "unsupported_media_type",
        )


async def read_json(request: Request, limit_bytes: int) -> Any:
    _check_media_type(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise HttpError(413, f"request body over {limit_bytes} bytes", "invalid_request_error", "too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit_bytes:
            raise HttpError(
                413, f"request body over {limit_bytes} bytes", "invalid_request_error", "too_large"
            )
    try:
        return json.loads(body, parse_constant=_no_constants)  # NaN / Infinity are not JSON
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="bad_json") from None


def parse_model(cls: type[BaseModel], data: Any) -> Any:
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        more = f" (and {len(exc.errors()) - 1} more problems)" if len(exc.errors()) > 1 else ""
        raise bad_request(f"{where}: {err['msg']}{more}", param=where) from None


def slo_from_headers(request: Request, cfg: RouterConfig) -> tuple[float, float]:
    """(ttft_ms, tpot_ms) from the SLO headers, else the configured defaults."""
    out = []
    for header, default in ((SLO_TTFT_HEADER, cfg.slo.ttft_ms), (SLO_TPOT_HEADER, cfg.slo.tpot_ms)):
        raw = request.headers.get(header)
        if raw is None:
            out.append(default)
            continue
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not math.isfinite(value) or value <= 0:
            raise bad_request(
                f"header {header} must be a positive number of milliseconds, got {raw!r}", param=header
            )
        out.append(value)
    return out[0], out[1]


class RateLimiter:
    """A token bucket per key (API key, or client address when keys are off). At most `max_keys` buckets
    are kept: past that the least recently used one goes (it is the most refilled, so forgetting it
    costs the least), never all of them at once."""

    def __init__(
        self, rate_per_s: float, burst: int, clock: Any = time.monotonic, max_keys: int = 100_000
    ) -> None:
        self.rate, self.burst, self.clock, self.max_keys = rate_per_s, burst, clock, max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _tokens(self, key: str, now: float) -> float:
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - last) * self.rate)

    def has_tokens(self, key: str) -> bool:
        """Whether `allow(key)` would pass now (nothing is consumed)."""
        return self.rate <= 0 or self._tokens(key, self.clock()) >= 1.0

    def allow(self, key: str) -> bool:
        if self.rate <= 0:
            return True
        now = self.clock()
        tokens = self._tokens(key, now)
        ok = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if ok else tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return ok

    def __len__(self) -> int:
        return len(self._buckets)
