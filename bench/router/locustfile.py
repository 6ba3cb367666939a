"""Locust load for the live local stack (`zipkv up`): mixed streamed and non-streamed completions and
chats, spread over every router in ZIPKV_ROUTERS (comma-separated base URLs; default the --host).
A request fails unless it ends complete: 200 and, when streamed, a final `data: [DONE]`.

    locust -f bench/router/locustfile.py --headless -u 8 -r 8 -t 180s --host http://127.0.0.1:8000 \
        --csv out/locust
"""

from __future__ import annotations

import itertools
import json
import os
import random

from locust import HttpUser, between, task

MODEL = os.environ.get("ZIPKV_MODEL", "zipkv-tiny")
ROUTERS = [u for u in os.environ.get("ZIPKV_ROUTERS", "").split(",") if u]
_next_router = itertools.count()


class CompletionUser(HttpUser):
    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        if ROUTERS:  # each simulated user sticks to one router, round robin over them
            self.client.base_url = ROUTERS[next(_next_router) % len(ROUTERS)]

    def _post(self, path: str, body: dict[str, object], name: str) -> None:
        stream = bool(body.get("stream"))
        with self.client.post(path, json=body, stream=stream, catch_response=True, name=name) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            if not stream:
                out = r.json()
                if out["usage"]["completion_tokens"] < 1:
                    r.failure("empty completion")
                return
            lines = [line for line in r.iter_lines(decode_unicode=True) if line]
            if not lines or lines[-1] != "data: [DONE]":
                r.failure(f"stream ended without [DONE]: {lines[-1:] if lines else 'nothing'}")
            elif any('"error"' in line for line in lines):
                r.failure("stream carried an error event")
            else:
                json.loads(lines[-2][6:])  # the last chunk is valid JSON

    @task(3)
    def completion_streamed(self) -> None:
        body = {
            "model": MODEL,
            "prompt": "load " * random.randint(1, 40),
            "max_tokens": random.randint(4, 48),
        }
        self._post("/v1/completions", {**body, "stream": True}, "completion stream")

    @task(2)
    def completion(self) -> None:
        body = {
            "model": MODEL,
            "prompt": "load " * random.randint(1, 40),
            "max_tokens": random.randint(4, 48),
        }
        self._post("/v1/completions", body, "completion")

    @task(2)
    def chat_streamed(self) -> None:
        messages = [{"role": "user", "content": "hello " * random.randint(1, 20)}]
        body = {"model": MODEL, "messages": messages, "max_tokens": random.randint(4, 32), "stream": True}
        self._post("/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}, "chat stream")

    @task(1)
    def chat(self) -> None:
        messages = [{"role": "user", "content": "hello " * random.randint(1, 20)}]
        self._post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 16}, "chat")
