"""The OpenAPI 3.1 document of both surfaces, built from the core's rules and names."""

from __future__ import annotations

from typing import Any

from .._config import Surface
from .._core import rules, surfaces
from .._core.serving import EXTRA_STATES, WIRE_RESOLUTIONS, WIRE_STATES
from .._core.surfaces import ALPHA, BETA

VERSION = "1.0.0-stage3a2"

_PROMPT = {
    "type": "string",
    "minLength": 1,
    "maxLength": rules.PROMPT_MAX_CHARS,
    "pattern": r"\S",
}
_RATIO = {"type": "string", "enum": list(rules.ASPECT_RATIOS)}
_TASK_ID = {"type": "string", "pattern": "^[1-9][0-9]*$"}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "One opaque value per logical request; a retry reuses it. Always send it.",
    "schema": {"type": "string", "minLength": 1, "maxLength": rules.IDEMPOTENCY_KEY_MAX_CHARS},
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


def _errors(schema: str, *statuses: int) -> dict[str, Any]:
    descriptions = {
        400: "Malformed request (invalid_json, invalid_idempotency_key, invalid_task_id)",
        401: "Missing or unknown API key (unauthorized)",
        404: "Unknown task, or another key's task (task_not_found)",
        409: "The same Idempotency-Key is in flight (idempotency_in_progress); see Retry-After",
        413: "Body larger than 256 KiB (body_too_large)",
        422: "A request rule was broken, or the key was reused with another body "
        "(idempotency_key_reused)",
        429: "Rate limited (rate_limited); see Retry-After",
        500: "Server error (internal_error, bad_gateway, service_unavailable, gateway_timeout)",
    }
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {
        str(s): {"description": descriptions[s], "content": {"application/json": {"schema": ref}}}
        for s in statuses
    }


def _ok(schema: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}


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
                                        "url": {"type": "array", "items": {"type": "string"}}
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
    submit_errors = (400, 401, 409, 413, 422, 429, 500)
    query_errors = (400, 401, 404, 429, 500)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "imggw asynchronous image-generation gateway (reference)",
            "version": VERSION,
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
                        **_ok("AlphaSubmitResponse"),
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
                        **_ok("BetaSubmitResponse"),
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
        },
    }
