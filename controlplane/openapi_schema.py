"""The router's OpenAPI document: the request bodies and the error shape the handlers really use.

The handlers read the body themselves (to answer every problem in the OpenAI error shape), so FastAPI
cannot see their models; this adds them, and the responses each route can give, to `/openapi.json`.
The fuzz test (tests/controlplane/test_router_fuzz.py) drives the router from this document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from zipkv.controlplane.openai_api import ChatRequest, CompletionRequest

REF = "#/components/schemas/{model}"
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}
# The completion routes (path -> the kind router.py serves there). They are plain ASGI routes (app.py), which
# FastAPI's generator does not list, so their operations are written here, named as it named them.
COMPLETION_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "text"}
_OPERATIONS = {
    "/v1/chat/completions": ("Chat", "chat_v1_chat_completions_post", ChatRequest),
    "/v1/completions": ("Completions", "completions_v1_completions_post", CompletionRequest),
}
COMPLETION_ERRORS = ("400", "401", "404", "405", "413", "415", "429", "499", "500", "502", "503", "504")


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
    }


def _body(model: type[BaseModel], components: dict[str, Any], served: list[str]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=REF)
    schema["properties"]["model"]["enum"] = served  # another name gets 400 listing these
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
    }


def install(app: FastAPI, served: list[str]) -> None:
    """Make `app.openapi()` (and /openapi.json) describe the real bodies and responses."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version="1", routes=app.routes)
        doc["paths"] = {path: {"post": {}} for path in COMPLETION_ROUTES} | doc.get("paths", {})
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        components["Error"] = ERROR_SCHEMA
        ok = {"type": "object"}
        for path, (summary, operation_id, model) in _OPERATIONS.items():
            op = doc["paths"][path]["post"]
            op["summary"], op["operationId"] = summary, operation_id
            op["requestBody"] = _body(model, components, served)
            op["responses"] = {
                "200": {
                    "description": "the completion (JSON), or Server-Sent Events with stream: true",
                    "content": {
                        "application/json": {"schema": ok},
                        "text/event-stream": {
                            "schema": {"type": "object", "properties": {"data": {"type": "string"}}}
                        },
                    },
                },
                **{code: _error("refused; the body says why") for code in COMPLETION_ERRORS},
            }
        doc["paths"]["/v1/models"]["get"]["responses"] = {
            "200": {"description": "served models", "content": {"application/json": {"schema": ok}}},
            **{code: _error("refused") for code in ("401", "429")},
        }
        doc["paths"]["/readyz"]["get"]["responses"] = {
            code: {"description": "readiness", "content": {"application/json": {"schema": ok}}}
            for code in ("200", "503")
        }
        doc["paths"]["/metrics"]["get"]["responses"] = {
            "200": {
                "description": "Prometheus text",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        }
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
