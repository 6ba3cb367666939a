"""The OpenAI-compatible HTTP API over real HTTP, with scripted workers (stand-ins) over real gRPC."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from router_harness import MODEL, Stack, stack

from zipkv.testing.scripted_worker import Script


@pytest.fixture(scope="module")
def s() -> Iterator[Stack]:
    with stack(http={"max_request_bytes": 65536}) as st:
        st.keep_reporting(st.add_worker(total_tokens=10_000_000))
        yield st


def client(s: Stack, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)


def test_openai_client_completion_and_chat(s: Stack) -> None:
    c = client(s)
    out = c.completions.create(model=MODEL, prompt="hi", max_tokens=5)
    assert out.choices[0].text == "hello"
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (3, 5)
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=11)
    assert chat.choices[0].message.content == "hello from "
    assert chat.choices[0].message.role == "assistant"
    # ByteTokenizer chat template: BOS + "user: hi\nassistant: " = 1 + 20 tokens
    assert chat.usage is not None and chat.usage.prompt_tokens == 21


def test_openai_client_streaming_with_usage(s: Stack) -> None:
    c = client(s)
    stream = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "hello"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    comp = list(c.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True))
    assert "".join(ch.choices[0].text for ch in comp) == "hel"
    assert all(ch.usage is None for ch in comp)


def test_sse_wire_format_ends_with_done(s: Stack) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_stop_strings_end_the_text(s: Stack) -> None:
    out = client(s).completions.create(model=MODEL, prompt="x", max_tokens=30, stop=["from"])
    assert out.choices[0].text == "hello "
    assert out.choices[0].finish_reason == "stop"


def test_models_health_ready_metrics(s: Stack) -> None:
    models = client(s).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(s.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(s.url + "/readyz").json()
    assert ready["status"] == "ok" and ready["workers"] == 1
    metrics = httpx.get(s.url + "/metrics").text
    for name in (
        "zipkv_router_ttft_ms_bucket",
        "zipkv_router_itl_ms_bucket",
        "zipkv_router_e2e_ms_bucket",
        "zipkv_router_placements_total",
        "zipkv_router_worker_headroom_tokens{",
        "zipkv_router_placement_ms_bucket",
    ):
        assert name in metrics


def _post(
    s: Stack,
    body: object,
    path: str = "/v1/completions",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    if isinstance(body, bytes):
        headers = {"content-type": "application/json", **(headers or {})}
        return httpx.post(s.url + path, content=body, headers=headers)
    return httpx.post(s.url + path, json=body, headers=headers)


@pytest.mark.parametrize(
    ("body", "headers", "needle"),
    [
        (b"{not json", {}, "not valid JSON"),
        ([1, 2], {}, "JSON object"),
        ({"model": "nope", "prompt": "x"}, {}, "unknown model 'nope'"),
        ({"model": MODEL, "prompt": "x" * 4096}, {}, "prompt has 4097 tokens"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 4095}, {}, "exceeds the context"),
        ({"model": MODEL, "prompt": "x", "temperature": 3}, {}, "temperature"),
        ({"model": MODEL, "prompt": "x", "top_p": 0}, {}, "top_p"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, {}, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "n": 2}, {}, "n:"),
        ({"model": MODEL, "prompt": [1, 999]}, {}, "token ids must be in [0, 259)"),
        ({"model": MODEL, "prompt": ["a", "b"]}, {}, "batched prompts"),
        ({"model": MODEL}, {}, "prompt"),
        ({"model": MODEL, "prompt": "x"}, {"x-zipkv-slo-ttft-ms": "soon"}, "x-zipkv-slo-ttft-ms"),
        ({"model": MODEL, "prompt": "x"}, {"x-zipkv-slo-tpot-ms": "-5"}, "x-zipkv-slo-tpot-ms"),
    ],
)
def test_malformed_requests_get_400(s: Stack, body: object, headers: dict[str, str], needle: str) -> None:
    r = _post(s, body, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"]
    assert err["type"] == "invalid_request_error"
    assert "Traceback" not in r.text


def test_chat_messages_are_validated(s: Stack) -> None:
    r = _post(s, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "/v1/chat/completions")
    assert r.status_code == 400 and "messages.0.role" in r.json()["error"]["message"]
    r = _post(s, {"model": MODEL, "messages": []}, "/v1/chat/completions")
    assert r.status_code == 400


def test_body_size_limit(s: Stack) -> None:
    r = _post(s, {"model": MODEL, "prompt": "x" * 70_000})
    assert r.status_code == 413 and "65536 bytes" in r.json()["error"]["message"]


def test_no_stack_trace_on_internal_errors(
    s: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tok = s.router.router.tokenizers[MODEL]

    def boom(text: str, add_bos: bool = True) -> list[int]:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(tok, "encode", boom)
    with caplog.at_level("ERROR", logger="zipkv.controlplane"):
        r = _post(s, {"model": MODEL, "prompt": "x"})
    assert r.status_code == 500
    assert "secret" not in r.text and "Traceback" not in r.text
    # The client gets an id to find the stack trace by in the router's log.
    error_id = re.search(r"error_id ([0-9a-f]{16})", r.json()["error"]["message"])
    assert error_id, r.text
    (logged,) = [rec for rec in caplog.records if getattr(rec, "error_id", None) == error_id.group(1)]
    assert logged.exc_info is not None and "secret internal detail" in str(logged.exc_info[1])


def test_api_keys() -> None:
    with stack(security={"api_keys": ["k1"]}) as st:
        st.add_worker()
        with pytest.raises(openai.AuthenticationError):
            client(st, "wrong").completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert httpx.get(st.url + "/v1/models").status_code == 401
        out = client(st, "k1").completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert out.choices[0].text == "h"
        assert httpx.get(st.url + "/healthz").status_code == 200  # probes need no key


def test_rate_limit_429() -> None:
    with stack(limits={"requests_per_s": 0.001, "burst": 2}) as st:
        st.add_worker()
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        codes = [_post(st, body).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        r = _post(st, body)
        assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "rate_limited"


def test_inflight_limit_429() -> None:
    with stack(limits={"max_inflight_requests": 1}) as st:
        st.add_worker(Script(itl_s=0.05))
        body = {"model": MODEL, "prompt": "x", "max_tokens": 20, "stream": True}
        with httpx.stream("POST", st.url + "/v1/completions", json=body) as first:
            lines = first.iter_lines()  # keep a reference: a dropped iterator closes the stream
            next(lines)
            r = _post(st, {**body, "stream": False})
            assert r.status_code == 429 and r.json()["error"]["code"] == "over_capacity"
        assert (
            'zipkv_router_rejections_total{reason="over_capacity"} 1.0' in httpx.get(st.url + "/metrics").text
        )


def test_inflight_limit_counts_requests_still_waiting_for_their_first_token() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with stack(limits={"max_inflight_requests": 1}) as st:
        st.add_worker(Script(ttft_s=0.6))
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(_post, st, body)
            time.sleep(0.3)  # the first one is placed and waits for its first token
            assert _post(st, body).status_code == 429
            assert first.result().status_code == 200
        assert httpx.get(st.url + "/readyz").json()["inflight_requests"] == 0


def test_refused_requests_leave_no_inflight_count(s: Stack) -> None:
    for _ in range(3):
        assert _post(s, {"model": "nope", "prompt": "x"}).status_code == 400
    assert httpx.get(s.url + "/readyz").json()["inflight_requests"] == 0


def test_503_with_retry_after_when_no_worker_fits() -> None:
    with stack(placement={"headroom_wait_ms": 0}) as st:  # refused at once (test_headroom_wait.py waits)
        r = _post(st, {"model": MODEL, "prompt": "x"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        w = st.add_worker(total_tokens=1000)
        assert st.report(w, headroom_tokens=100).accepted  # busy: 100 of its 1000 tokens free
        r = _post(st, {"model": MODEL, "prompt": "x", "max_tokens": 200})  # needs 202 > 100 free
        assert r.status_code == 503 and "1 worker without KV headroom for it" in r.json()["error"]["message"]
        assert _post(st, {"model": MODEL, "prompt": "x", "max_tokens": 20}).status_code == 200


def test_chat_uses_the_models_own_template(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "user": 3, "hello": 4, "|": 5}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])  # matched before pre-tokenising, as in real tokenizers
    tok.save(str(tmp_path / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}{{ m['role'] }} | {{ m['content'] }} {% endfor %}"
    config = {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with stack(models=[{"name": "local", "tokenizer": str(tmp_path), "max_context_tokens": 64}]) as st:
        w = st.add_worker(model="local")
        body = {"model": "local", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        r = httpx.post(st.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        # "<s>user | hello " -> <s>=1 user=3 |=5 hello=4; the template placed BOS, none is added.
        assert list(w.seen.requests[0].prompt_token_ids) == [1, 3, 5, 4]
        assert list(w.seen.requests[0].sampling.stop_token_ids) == [2]  # the tokenizer's EOS


def test_context_reported_by_workers_bounds_the_prompts_accepted() -> None:
    with stack() as st:  # configured context 4096
        st.add_worker(max_context_tokens=100)
        r = _post(st, {"model": MODEL, "prompt": "x" * 150})
        assert r.status_code == 400 and "accepts at most 99" in r.json()["error"]["message"]
        r = _post(st, {"model": MODEL, "prompt": "x" * 50, "max_tokens": 60})  # 51 + 60 > 100
        assert r.status_code == 400 and "exceeds the context of 100" in r.json()["error"]["message"]
        assert _post(st, {"model": MODEL, "prompt": "x" * 50, "max_tokens": 40}).status_code == 200
        # Without max_tokens the default is capped by the context: 256 -> 100 - 51 = 49 new tokens.
        r = _post(st, {"model": MODEL, "prompt": "x" * 50})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 49
