"""A bounded fuzz of the router's OpenAPI document with schemathesis: generated requests (valid and
invalid bodies, headers, methods) against a real router on loopback with a scripted worker behind it.
No 5xx, and every response matches the document (status, content type, body schema)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from router_harness import MODEL, Stack, stack
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

# Bounded so the default run stays short (~20 s on a 2-core machine); raise for a longer soak.
EXAMPLES = 60


@pytest.fixture(scope="module")
def fuzz_stack() -> Iterator[Stack]:
    # A short context keeps each generated request small (a fuzzed max_tokens is capped by it).
    models = [{"name": MODEL, "tokenizer": "byte", "max_context_tokens": 256}]
    with stack(http={"max_request_bytes": 65536}, models=models) as st:
        st.keep_reporting(st.add_worker(total_tokens=10_000_000, max_context_tokens=256))
        yield st


def test_fuzzed_requests_never_get_a_5xx_and_match_the_schema(fuzz_stack: Stack) -> None:
    schema = schemathesis.openapi.from_url(fuzz_stack.url + "/openapi.json")
    seen: dict[str, dict[int, int]] = {}
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    # Negative cases (bodies that break the schema) only where there is a body to break.
    modes = {"POST": (GenerationMode.POSITIVE, GenerationMode.NEGATIVE), "GET": (GenerationMode.POSITIVE,)}
    cases = [(op, mode) for op in operations for mode in modes[op.method.upper()]]
    for op, mode in cases:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=fuzz_stack.url, timeout=30)
            counts = seen.setdefault(f"{case.method} {case.path} {case.meta.generation.mode.value}", {})
            counts[response.status_code] = counts.get(response.status_code, 0) + 1
            assert response.status_code < 500, (
                f"{case.method} {case.path}: {response.status_code} {response.text[:500]}"
            )
            case.validate_response(response, checks=checks)

        run()
    print("fuzz status codes per operation:", seen)  # shown with -s; docs/reliability.md quotes a run
    valid, invalid = seen["POST /v1/completions positive"], seen["POST /v1/completions negative"]
    assert valid.get(200, 0) > 0 and set(invalid) <= set(range(400, 500)), seen
