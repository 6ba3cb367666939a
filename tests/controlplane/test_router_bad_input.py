"""Bad HTTP input gets a clear 4xx in the OpenAI error shape, never a 5xx or a silently wrong answer.
Real HTTP to a real router, scripted workers (stand-ins for GPU workers) over real gRPC."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from router_harness import MODEL, Stack, stack

from zipkv.controlplane.gate import RateLimiter
from zipkv.testing.scripted_worker import Script

OK = {"model": MODEL, "prompt": "x", "max_tokens": 2}


@pytest.fixture(scope="module")
def s() -> Iterator[Stack]:
    with stack() as st:
        st.keep_reporting(st.add_worker(total_tokens=10_000_000))
        yield st


def _openai_error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert "Traceback" not in r.text
    return err


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"seed": 1 << 64}, "seed"),  # was a protobuf range error: 500
        ({"seed": -1}, "seed"),
        ({"top_k": 1 << 31}, "top_k"),  # was a protobuf range error: 500
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 1 << 40}, "max_tokens"),
        ({"temperature": "1e999"}, "temperature"),  # JSON 1e999 parses as infinity
        ({"top_p": "-1e999"}, "top_p"),
    ],
)
def test_numeric_fields_out_of_range_get_400(s: Stack, extra: dict[str, object], param: str) -> None:
    fields = [f'"{k}": {v}' for k, v in {**OK, **extra}.items() if k != "prompt" and k != "model"]
    body = '{"model": "zipkv-tiny", "prompt": "x", ' + ", ".join(fields) + "}"
    r = httpx.post(s.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    err = _openai_error(r, 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"seed": True}, "seed"),  # a boolean is not a seed (it was read as 1)
        ({"max_tokens": True}, "max_tokens"),
        ({"stream": 0.0}, "stream"),  # a number is not a boolean (it was read as false)
        ({"prompt": [True, False, True]}, "prompt"),  # booleans are not token ids (they were 1, 0, 1)
        ({"stream_options": {"include_usage": 1}}, "stream_options"),
    ],
)
def test_values_of_the_wrong_json_type_get_400(s: Stack, body: dict[str, object], param: str) -> None:
    r = httpx.post(s.url + "/v1/completions", json={"model": "zipkv-tiny", "prompt": "x", **body})
    err = _openai_error(r, 400)
    assert str(err["param"]).startswith(param) and err["type"] == "invalid_request_error"


def test_nan_is_not_json(s: Stack) -> None:
    body = b'{"model": "zipkv-tiny", "prompt": "x", "temperature": NaN}'
    r = httpx.post(s.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    err = _openai_error(r, 400)
    assert "NaN is not a JSON number" in str(err["message"])


def test_large_seeds_reach_the_worker_and_seed_zero_is_a_seed(s: Stack) -> None:
    worker = s.workers[0]
    for seed in (0, (1 << 63) - 2):
        assert httpx.post(s.url + "/v1/completions", json={**OK, "seed": seed}).status_code == 200
        assert worker.seen.requests[-1].sampling.seed == seed + 1  # 0 on the wire means "no seed"
    assert httpx.post(s.url + "/v1/completions", json=OK).status_code == 200
    assert worker.seen.requests[-1].sampling.seed == 0


def test_text_plain_body_gets_415(s: Stack) -> None:
    r = httpx.post(s.url + "/v1/completions", content=b'{"model": "zipkv-tiny", "prompt": "x"}')
    assert "application/json" in str(_openai_error(r, 415)["message"])
    r = httpx.post(s.url + "/v1/completions", json=OK, headers={"content-type": "text/plain"})
    _openai_error(r, 415)


def test_404_and_405_have_the_openai_shape(s: Stack) -> None:
    err = _openai_error(httpx.post(s.url + "/v1/embeddings", json=OK), 404)
    assert "/v1/completions" in str(err["message"])  # says what exists
    r = httpx.get(s.url + "/v1/completions")
    err = _openai_error(r, 405)
    assert r.headers["allow"] == "POST" and "POST" in str(err["message"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logprobs", True),
        ("logprobs", 5),
        ("top_logprobs", 3),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("response_format", {"type": "json_object"}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1),
        ("logit_bias", {"50": 10}),
        ("best_of", 2),
        ("suffix", "end"),
    ],
)
def test_unsupported_fields_are_refused_by_name(s: Stack, field: str, value: object) -> None:
    for path, body in (
        ("/v1/completions", OK),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
    ):
        err = _openai_error(httpx.post(s.url + path, json={**body, field: value}), 400)
        assert err["param"] == field and field in str(err["message"])


def test_unsupported_fields_at_their_unused_value_are_accepted(s: Stack) -> None:
    unused = {"logprobs": None, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}}
    r = httpx.post(s.url + "/v1/completions", json={**OK, **unused, "best_of": 1, "tools": []})
    assert r.status_code == 200, r.text


def test_non_ascii_bearer_key_is_401_not_500() -> None:
    with stack(security={"api_keys": ["key-0123456789abcdef"]}) as st:
        st.add_worker()
        headers = {"authorization": "Bearer kéy-0123456789abcdef".encode("latin-1")}
        r = httpx.post(st.url + "/v1/completions", json=OK, headers=headers)  # was hmac's TypeError: 500
        assert _openai_error(r, 401)["code"] == "invalid_api_key"
        good = {"authorization": "Bearer key-0123456789abcdef"}
        assert httpx.post(st.url + "/v1/completions", json=OK, headers=good).status_code == 200


def test_failed_api_key_attempts_are_limited_per_address() -> None:
    with stack(security={"api_keys": ["key-0123456789abcdef"], "auth_failures_per_minute": 3}) as st:
        st.add_worker()
        wrong = {"authorization": "Bearer guess-0000000000000"}
        codes = [httpx.post(st.url + "/v1/completions", json=OK, headers=wrong).status_code for _ in range(5)]
        assert codes == [401, 401, 401, 429, 429]
        # Locked out for the window: even the right key is not checked from this address.
        good = {"authorization": "Bearer key-0123456789abcdef"}
        r = httpx.post(st.url + "/v1/completions", json=OK, headers=good)
        assert _openai_error(r, 429)["code"] == "auth_failures" and r.headers["retry-after"] == "60"
        assert httpx.get(st.url + "/v1/models", headers=wrong).status_code == 429


def test_rate_limiter_keeps_a_busy_keys_bucket_under_key_churn() -> None:
    # It used to drop every bucket once 100k keys were seen: a limited key got a fresh burst.
    now = [0.0]
    lim = RateLimiter(rate_per_s=0.001, burst=1, clock=lambda: now[0])
    assert lim.allow("hot") and not lim.allow("hot")
    for i in range(150_000):
        lim.allow(f"client-{i}")
        if i % 1000 == 0:
            assert not lim.allow("hot"), f"the busy key's bucket was dropped after {i} other keys"
    assert len(lim) <= 100_000


def test_worker_invalid_argument_is_400_with_the_workers_message() -> None:
    with stack() as st:
        st.add_worker(Script(refuse=grpc.StatusCode.INVALID_ARGUMENT))
        err = _openai_error(httpx.post(st.url + "/v1/completions", json=OK), 400)  # was 502
        assert "scripted refusal" in str(err["message"]) and err["code"] == "worker_invalid_argument"


def test_a_request_larger_than_every_workers_budget_is_400() -> None:
    with stack() as st:
        st.add_worker(total_tokens=100)
        st.add_worker(total_tokens=150)
        r = httpx.post(st.url + "/v1/completions", json={**OK, "max_tokens": 200})  # needs 202
        err = _openai_error(r, 400)  # was 503 + Retry-After, forever
        assert err["code"] == "too_large" and "largest: 150" in str(err["message"])
        assert "retry-after" not in r.headers


def test_readyz_is_503_without_a_worker_and_names_why() -> None:
    with stack(placement={"stale_after_ms": 200, "expire_after_ms": 400}) as st:
        r = httpx.get(st.url + "/readyz")  # was 200 "ok" while every completion got 503
        assert r.status_code == 503 and r.json()["status"] == "unavailable"
        assert any(x.startswith("no_worker") for x in r.json()["reasons"])
        w = st.add_worker()
        r = httpx.get(st.url + "/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ok", r.json()
        assert r.json()["models"][MODEL]["ready"] == 1
        assert st.report(w, draining=True).accepted
        r = httpx.get(st.url + "/readyz")
        assert r.status_code == 503 and "1 draining" in r.json()["reasons"][0]
        assert st.report(w, draining=False).accepted
        time.sleep(0.5)  # its reports stop
        assert httpx.get(st.url + "/readyz").status_code == 503


def test_seed_reaches_the_sglang_engine() -> None:
    from zipkv.worker.engine import SamplingOptions
    from zipkv.worker.engines.sglang.engine_args import sglang_sampling_params

    assert sglang_sampling_params(SamplingOptions(seed=43))["sampling_seed"] == 43
    assert sglang_sampling_params(SamplingOptions())["sampling_seed"] is None
