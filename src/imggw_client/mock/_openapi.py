"""The OpenAPI 3.1 document of both surfaces and the result links, built from the core's rules
and names. It declares every status the gateway can send on each route (faults included), the
headers it sends (``Retry-After``, ``Idempotent-Replayed``), and the rules it enforces
(``Idempotency-Key`` printable ASCII, the prompt's ECMA-262 ``\\S``); the test suite runs
schemathesis and openapi-spec-validator against it, so the two cannot drift apart."""

from __future__ import annotations

from typing import Any

from .._config import Surface
from .._core import rules, surfaces
from .._core.serving import EXTRA_STATES, WIRE_RESOLUTIONS, WIRE_STATES
from .._core.surfaces import ALPHA, BETA

VERSION = "1.0.0-stage3a2"
_ABOUT = """The reference gateway of both surfaces.

- Idempotency keys belong to the API key, not to a surface: a key is bound to its first
  request (surface and body). The same request again replays the first answer
  (`Idempotent-Replayed: true`); another request, or the same one on the other surface, is
  refused (422 `idempotency_key_reused`).
- Request limits, when the gateway is started with them: at most N submits (or queries) per API
  key in any S seconds, both surfaces together; the excess gets 429 `rate_limited` with
  `Retry-After` (whole seconds until a slot frees) and changes nothing.
- Result links are signed (`Expires`, `Signature`) and valid for the link TTL; a dead or
  tampered link answers 403, a result past its retention 410.
- 500, 502, 503 and 504 (and 429) are only sent when faults are injected.
"""

_PROMPT = {
    "type": "string",
    "minLength": 1,
    "maxLength": rules.PROMPT_MAX_CHARS,
    # The contract's \S, spelled out: engines other than ECMA-262 read \S differently.
    "pattern": rules.NON_BLANK_PATTERN,
    "description": "Unicode text (no surrogate code points) with a character outside ECMA-262 "
    "whitespace and line terminators.",
}
_RATIO = {"type": "string", "enum": list(rules.ASPECT_RATIOS)}
_TASK_ID = {"type": "string", "pattern": f"^{rules.TASK_ID_REGEX}$"}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "One opaque value per logical request; a retry reuses it. Always send it.",
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": rules.IDEMPOTENCY_KEY_MAX_CHARS,
        "pattern": rules.IDEMPOTENCY_KEY_PATTERN,
    },
}


def _states(surface: Surface) -> list[str]:
    """Every state a record of the surface may show, the quirks' extra ones included."""
    return [*WIRE_STATES[surface].values(), *EXTRA_STATES[surface].values()]


def _combination_rules(
    ratio_path: list[str], resolution_path: list[str], surface: Surface
) -> list[Any]:
    """SPEC 2.4's combination rules as JSON Schema if/then clauses, in the surface's wire form."""

    def nest(path: list[str], schema: dict[str, Any]) -> dict[str, Any]:
        for name in reversed(path):
            schema = {"properties": {name: schema}, "required": [name]}
        return schema

    one_k, _, four_k = WIRE_RESOLUTIONS[surface]
    return [
        {
            "if": nest(ratio_path, {"enum": list(rules.ONLY_1K)}),
            "then": nest(resolution_path, {"const": one_k}),
        },
        {
            "if": nest(ratio_path, {"enum": list(rules.NO_4K)}),
            "then": nest(resolution_path, {"not": {"const": four_k}}),
        },
    ]


_DESCRIPTIONS = {
    400: "Malformed request (invalid_json: not one JSON object, nested too deep, or a repeated "
    "key; invalid_idempotency_key; invalid_task_id)",
    401: "Missing or unknown API key (unauthorized)",
    404: "Unknown task, or another key's task (task_not_found)",
    409: "The same Idempotency-Key is in flight (idempotency_in_progress); see Retry-After",
    413: "Body larger than 256 KiB (body_too_large)",
    422: "A request rule was broken, or the key was bound to another request, on either "
    "surface (idempotency_key_reused)",
    429: "Over the key's request limit, or injected (rate_limited); see Retry-After",
    500: "Server error (internal_error), injected; nothing was processed",
    502: "Upstream failure (bad_gateway), injected; nothing was processed",
    503: "Overloaded (service_unavailable), injected; nothing was processed",
    504: "Upstream timeout (gateway_timeout), injected; nothing was processed",
}
_SERVER_ERRORS = (500, 502, 503, 504)
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Whole seconds to wait before trying again",
        "schema": {"type": "integer", "minimum": 0},
    }
}
_REPLAYED = {
    surfaces.REPLAYED_HEADER: {
        "description": "Sent on a replay: the first answer to this Idempotency-Key, no new task",
        "schema": {"type": "string", "enum": ["true"]},
    }
}


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


def _errors(schema: str, *statuses: int) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status in statuses:
        response = {"description": _DESCRIPTIONS[status], "content": _json(schema)}
        if status in (409, 429):
            response["headers"] = _RETRY_AFTER
        responses[str(status)] = response
    return responses


def _ok(schema: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response = {"description": "OK", "content": _json(schema)}
    if headers:
        response["headers"] = headers
    return {"200": response}


def _text(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}


def _results_path() -> dict[str, Any]:
    return {
        "get": {
            "operationId": "resultFile",
            "summary": "A result image, through a signed link a task record handed out",
            "description": "Needs no API key: the link is the credential. Each query of a "
            "succeeded task hands out a fresh link valid for the gateway's link TTL (never past "
            "the retention); the file is kept for the retention after completion.",
            "security": [],
            "parameters": [
                {
                    "name": "file",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9a-f]{32}\\.png$"},
                },
                {
                    "name": "Expires",
                    "in": "query",
                    "required": True,
                    "description": "Unix seconds at which the link stops working",
                    "schema": {"type": "integer", "minimum": 0},
                },
                {
                    "name": "Signature",
                    "in": "query",
                    "required": True,
                    "description": "HMAC of the path and Expires, lower-case hex",
                    "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                },
            ],
            "responses": {
                "200": {
                    "description": "The image",
                    "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
                },
                "403": _text(
                    "The link is past its Expires, unsigned, or its signature does "
                    "not match (as an object store answers)"
                ),
                "404": _text("No such result (unknown, failed or unfinished task)"),
                "410": _text("The result is past its retention window and no longer kept"),
                **_errors("BetaError", 429, *_SERVER_ERRORS),
            },
        }
    }


def _alpha_envelope(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["code", "msg", "data"],
        "properties": {"code": {"type": "integer"}, "msg": {"type": "string"}, "data": data},
    }


def _beta_envelope(data: dict[str, Any], code: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["code", "data"],
        "properties": {"code": code or {"type": "integer"}, "data": data},
    }


def openapi_document() -> dict[str, Any]:
    alpha_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["model", "input"],
        "properties": {
            "model": {"const": surfaces.ALPHA_MODEL},
            "input": {
                "type": "object",
                "additionalProperties": False,
                "required": ["prompt", "resolution", "aspect_ratio"],
                "properties": {
                    "prompt": _PROMPT,
                    "resolution": {"type": "string", "enum": list(WIRE_RESOLUTIONS[ALPHA])},
                    "aspect_ratio": _RATIO,
                },
            },
        },
        "allOf": _combination_rules(["input", "aspect_ratio"], ["input", "resolution"], ALPHA),
    }
    beta_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["model", "prompt", "size", "resolution", "n"],
        "properties": {
            "model": {"const": surfaces.BETA_MODEL},
            "prompt": _PROMPT,
            "size": _RATIO,
            "resolution": {"type": "string", "enum": list(WIRE_RESOLUTIONS[BETA])},
            "n": {"const": 1},
        },
        "allOf": _combination_rules(["size"], ["resolution"], BETA),
    }
    schemas = {
        "AlphaSubmitRequest": alpha_request,
        "BetaSubmitRequest": beta_request,
        "AlphaSubmitResponse": _alpha_envelope(
            {"type": "object", "required": ["taskId"], "properties": {"taskId": _TASK_ID}}
        ),
        "AlphaTaskRecord": _alpha_envelope(
            {
                "type": "object",
                "required": ["taskId", "state"],
                "properties": {
                    "taskId": _TASK_ID,
                    "state": {
                        "type": "string",
                        "enum": ["waiting", "queuing", "generating", "success", "fail"],
                    },
                    "progress": {"type": "integer", "minimum": 0, "maximum": 100},
                    "resultJson": {
                        "type": "string",
                        "description": 'On success: {"resultUrls": [url, ...]}',
                    },
                    "creditsConsumed": {"type": "string"},
                    "failCode": {"type": "string"},
                    "failMsg": {"type": "string"},
                },
            }
        ),
        "BetaSubmitResponse": _beta_envelope(
            {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "required": ["status", "task_id"],
                    "properties": {"status": {"const": "submitted"}, "task_id": _TASK_ID},
                },
            },
            code={"const": 200},
        ),
        "BetaTaskRecord": _beta_envelope(
            {
                "type": "object",
                "required": ["id", "status"],
                "properties": {
                    "id": _TASK_ID,
                    "status": {
                        "type": "string",
                        "enum": _states(BETA),
                    },
                    "progress": {"type": "integer", "minimum": 0, "maximum": 100},
                    "result": {
                        "type": ["object", "null"],
                        "properties": {
                            "images": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "url": {"type": "array", "items": {"type": "string"}},
                                        "expires_at": {
                                            "type": "integer",
                                            "description": "Unix seconds at which the links "
                                            "stop working",
                                        },
                                    },
                                },
                            }
                        },
                    },
                    "cost": {"type": "number"},
                    "credits_cost": {"type": "number"},
                    "error": {"$ref": "#/components/schemas/BetaErrorDetail"},
                },
            }
        ),
        "AlphaError": _alpha_envelope({"type": "null"}),
        "BetaErrorDetail": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        },
        "BetaError": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "code": {"type": "integer"},
                "error": {"$ref": "#/components/schemas/BetaErrorDetail"},
            },
        },
    }
    submit_errors = (400, 401, 409, 413, 422, 429, *_SERVER_ERRORS)
    query_errors = (400, 401, 404, 429, *_SERVER_ERRORS)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "imggw asynchronous image-generation gateway (reference)",
            "version": VERSION,
            "description": _ABOUT,
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            surfaces.ALPHA_SUBMIT_PATH: {
                "post": {
                    "operationId": "alphaCreateTask",
                    "parameters": [_IDEMPOTENCY_KEY],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/AlphaSubmitRequest"}
                            }
                        },
                    },
                    "responses": {
                        **_ok("AlphaSubmitResponse", _REPLAYED),
                        **_errors("AlphaError", *submit_errors),
                    },
                }
            },
            surfaces.ALPHA_QUERY_PATH: {
                "get": {
                    "operationId": "alphaRecordInfo",
                    "parameters": [
                        {"name": "taskId", "in": "query", "required": True, "schema": _TASK_ID}
                    ],
                    "responses": {**_ok("AlphaTaskRecord"), **_errors("AlphaError", *query_errors)},
                }
            },
            surfaces.BETA_SUBMIT_PATH: {
                "post": {
                    "operationId": "betaGenerate",
                    "parameters": [_IDEMPOTENCY_KEY],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/BetaSubmitRequest"}
                            }
                        },
                    },
                    "responses": {
                        **_ok("BetaSubmitResponse", _REPLAYED),
                        **_errors("BetaError", *submit_errors),
                    },
                }
            },
            surfaces.BETA_QUERY_PATH: {
                "get": {
                    "operationId": "betaTask",
                    "parameters": [
                        {"name": "id", "in": "path", "required": True, "schema": _TASK_ID}
                    ],
                    "responses": {**_ok("BetaTaskRecord"), **_errors("BetaError", *query_errors)},
                }
            },
            "/results/{file}": _results_path(),
        },
    }
