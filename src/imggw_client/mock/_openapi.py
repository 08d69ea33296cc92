"""The OpenAPI 3.1 document of both surfaces and the result links, derived from the wire spec
(``_core.spec``: paths, fields, states, envelopes), the reason table (``_core.reasons``: the
statuses each route answers, and why) and the request rules (``_core.rules``). It declares
every status the gateway can send on each route (faults included), the headers it sends
(``Retry-After``, ``Idempotent-Replayed``), and the rules it enforces (``Idempotency-Key``
printable ASCII, the prompt's ECMA-262 ``\\S``); the test suite runs schemathesis and
openapi-spec-validator against it, so the two cannot drift apart."""

from __future__ import annotations

from typing import Any

from .._core import reasons, rules, spec
from .._core.spec import ALPHA, BETA, MessageEnvelope, Operation, Surface, SurfaceSpec
from ._serving import Shape, request_shape

VERSION = "1.0.0-stage3a2"
_REUSED, _LIMITED = reasons.IDEMPOTENCY_KEY_REUSED, reasons.RATE_LIMITED
_ABOUT = f"""The reference gateway of both surfaces.

- Idempotency keys belong to the API key, not to a surface: a key is bound to its first
  request (surface and body). The same request again replays the first answer
  (`{spec.REPLAYED_HEADER}: true`); another request, or the same one on the other surface, is
  refused ({_REUSED.status} `{_REUSED.code}`).
- Request limits, when the gateway is started with them: at most N submits (or queries) per API
  key in any S seconds, both surfaces together; the excess gets {_LIMITED.status}
  `{_LIMITED.code}` with `{spec.RETRY_AFTER_HEADER}` (whole seconds until a slot frees) and
  changes nothing.
- Result links are signed (`{spec.LINK_EXPIRES}`, `{spec.LINK_SIGNATURE}`) and valid for the
  link TTL; a dead or tampered link answers 403, a result past its retention 410.
- 500, 502, 503 and 504 (and 429) are only sent when faults are injected.
"""
# Names of operations in the document (client generators name methods after them).
_OPERATION_IDS = {
    (ALPHA, spec.SUBMIT): "alphaCreateTask",
    (ALPHA, spec.QUERY): "alphaRecordInfo",
    (BETA, spec.SUBMIT): "betaGenerate",
    (BETA, spec.QUERY): "betaTask",
}

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
_PROGRESS = {"type": "integer", "minimum": 0, "maximum": 100}
_IDEMPOTENCY_KEY = {
    "name": spec.IDEMPOTENCY_HEADER,
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
_RETRY_AFTER = {
    spec.RETRY_AFTER_HEADER: {
        "description": "Whole seconds to wait before trying again",
        "schema": {"type": "integer", "minimum": 0},
    }
}
_REPLAYED = {
    spec.REPLAYED_HEADER: {
        "description": "Sent on a replay: the first answer to this Idempotency-Key, no new task",
        "schema": {"type": "string", "enum": ["true"]},
    }
}


def _schema_name(surface: Surface, what: str) -> str:
    return surface.capitalize() + what


def _states(wire: SurfaceSpec) -> list[str]:
    """Every state a record of the surface may show, the quirks' extra ones included, in
    lifecycle order."""
    written = {*wire.written.values(), *wire.quirk_states.values()}
    return [state for state in wire.states if state in written]


def _nest(path: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A schema that requires the dotted ``path`` and puts ``schema`` on it."""
    for name in reversed(path.split(".")):
        schema = {"properties": {name: schema}, "required": [name]}
    return schema


def _combination_rules(wire: SurfaceSpec) -> list[Any]:
    """SPEC 2.4's combination rules as JSON Schema if/then clauses, in the surface's wire form."""
    ratio, resolution = wire.request["aspect_ratio"], wire.request["resolution"]
    one_k, four_k = wire.wire_resolution("1k"), wire.wire_resolution("4k")
    return [
        {
            "if": _nest(ratio, {"enum": list(rules.ONLY_1K)}),
            "then": _nest(resolution, {"const": one_k}),
        },
        {
            "if": _nest(ratio, {"enum": list(rules.NO_4K)}),
            "then": _nest(resolution, {"not": {"const": four_k}}),
        },
    ]


def _request(wire: SurfaceSpec) -> dict[str, Any]:
    """The submit body's schema: every field required, nothing else allowed."""
    values: dict[str, Any] = {
        "model": {"const": wire.model},
        "prompt": _PROMPT,
        "resolution": {
            "type": "string",
            "enum": [wire.wire_resolution(r) for r in rules.RESOLUTIONS],
        },
        "aspect_ratio": _RATIO,
        "n": {"const": spec.N},
    }
    by_path = {path: values[name] for name, path in wire.request.items()}

    def shape(tree: Shape, prefix: str) -> dict[str, Any]:
        properties = {
            name: by_path[prefix + name] if inner is None else shape(inner, f"{prefix}{name}.")
            for name, inner in tree.items()
        }
        return {
            "type": "object",
            "additionalProperties": False,
            "required": list(tree),
            "properties": properties,
        }

    return {**shape(request_shape(wire.name), ""), "allOf": _combination_rules(wire)}


def _envelope(
    wire: SurfaceSpec, data: dict[str, Any], code: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An answer's schema around the schema of its ``data``."""
    envelope = wire.envelope
    if isinstance(envelope, MessageEnvelope):
        return {
            "type": "object",
            "required": [envelope.code, envelope.message, envelope.data],
            "properties": {
                envelope.code: code or {"type": "integer"},
                envelope.message: {"type": "string"},
                envelope.data: data,
            },
        }
    return {
        "type": "object",
        "required": [envelope.code, envelope.data],
        "properties": {envelope.code: code or {"type": "integer"}, envelope.data: data},
    }


def _submit_answer(wire: SurfaceSpec) -> dict[str, Any]:
    answer = wire.submit_answer
    item: dict[str, Any] = {"type": "object", "required": [], "properties": {}}
    if answer.status is not None:
        name, value = answer.status
        item["required"].append(name)
        item["properties"][name] = {"const": value}
    item["required"].append(answer.task_id)
    item["properties"][answer.task_id] = _TASK_ID
    data = (
        {"type": "array", "minItems": 1, "maxItems": 1, "items": item} if answer.in_list else item
    )
    return _envelope(wire, data, code={"const": 200} if answer.constant_code else None)


def _result(wire: SurfaceSpec) -> dict[str, Any]:
    fields = wire.record
    if fields.result_as_text:
        return {
            "type": "string",
            "description": f'On success: {{"{spec.RESULT_URLS}": [url, ...]}}',
        }
    image = {
        spec.IMAGE_URL: {"type": "array", "items": {"type": "string"}},
        spec.IMAGE_EXPIRES_AT: {
            "type": "integer",
            "description": "Unix seconds at which the links stop working",
        },
    }
    images = {"type": "array", "items": {"type": "object", "properties": image}}
    return {"type": ["object", "null"], "properties": {spec.RESULT_IMAGES: images}}


def _record(wire: SurfaceSpec) -> dict[str, Any]:
    fields = wire.record
    text_or_number = {"type": "string" if fields.credits_as_text else "number"}
    properties: dict[str, Any] = {
        fields.id: _TASK_ID,
        fields.state: {"type": "string", "enum": _states(wire)},
        fields.progress: _PROGRESS,
        fields.result: _result(wire),
    }
    if fields.cost is not None:
        properties[fields.cost] = {"type": "number"}
    properties[fields.credits] = text_or_number
    if fields.error is None:
        properties[fields.fail_code] = {"type": "string"}
        properties[fields.fail_message] = {"type": "string"}
    else:
        detail = _schema_name(wire.name, "ErrorDetail")
        properties[fields.error] = {"$ref": f"#/components/schemas/{detail}"}
    data = {"type": "object", "required": [fields.id, fields.state], "properties": properties}
    return _envelope(wire, data)


def _error_schemas(wire: SurfaceSpec) -> dict[str, Any]:
    envelope = wire.envelope
    if isinstance(envelope, MessageEnvelope):
        return {_schema_name(wire.name, "Error"): _envelope(wire, {"type": "null"})}
    detail = _schema_name(wire.name, "ErrorDetail")
    return {
        detail: {
            "type": "object",
            "required": [envelope.error_code, envelope.error_message],
            "properties": {
                envelope.error_code: {"type": "string"},
                envelope.error_message: {"type": "string"},
            },
        },
        _schema_name(wire.name, "Error"): {
            "type": "object",
            "required": [envelope.error],
            "properties": {
                envelope.code: {"type": "integer"},
                envelope.error: {"$ref": f"#/components/schemas/{detail}"},
            },
        },
    }


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


def _errors(schema: str, route: Operation) -> dict[str, Any]:
    """Every error status a route answers, each described by its reasons' rows."""
    sent = [r for r in reasons.REASONS if route in r.routes]
    responses: dict[str, Any] = {}
    for status in sorted({r.status for r in sent}):
        rows = [r for r in sent if r.status == status]
        why = "; ".join(f"{r.code}: {r.when}" for r in rows)
        response: dict[str, Any] = {"description": why, "content": _json(schema)}
        if any(r.retry_after for r in rows):
            response["description"] = f"{why}; see {spec.RETRY_AFTER_HEADER}"
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
                    "name": spec.LINK_EXPIRES,
                    "in": "query",
                    "required": True,
                    "description": "Unix seconds at which the link stops working",
                    "schema": {"type": "integer", "minimum": 0},
                },
                {
                    "name": spec.LINK_SIGNATURE,
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
                # Faults and limits answer in B's shape, the shape of paths of neither surface.
                **_errors(_schema_name(BETA, "Error"), spec.RESULT),
            },
        }
    }


def _paths(wire: SurfaceSpec) -> dict[str, Any]:
    name = wire.name
    error = _schema_name(name, "Error")
    where, param = wire.task_id_param
    return {
        wire.submit_path: {
            "post": {
                "operationId": _OPERATION_IDS[(name, spec.SUBMIT)],
                "parameters": [_IDEMPOTENCY_KEY],
                "requestBody": {
                    "required": True,
                    "content": _json(_schema_name(name, "SubmitRequest")),
                },
                "responses": {
                    **_ok(_schema_name(name, "SubmitResponse"), _REPLAYED),
                    **_errors(error, spec.SUBMIT),
                },
            }
        },
        wire.query_path: {
            "get": {
                "operationId": _OPERATION_IDS[(name, spec.QUERY)],
                "parameters": [{"name": param, "in": where, "required": True, "schema": _TASK_ID}],
                "responses": {
                    **_ok(_schema_name(name, "TaskRecord")),
                    **_errors(error, spec.QUERY),
                },
            }
        },
    }


def openapi_document() -> dict[str, Any]:
    """The document served at ``/openapi.json``."""
    wires = list(spec.SPECS.values())
    schemas: dict[str, Any] = {}
    for wire in wires:
        schemas[_schema_name(wire.name, "SubmitRequest")] = _request(wire)
    for wire in wires:
        schemas[_schema_name(wire.name, "SubmitResponse")] = _submit_answer(wire)
        schemas[_schema_name(wire.name, "TaskRecord")] = _record(wire)
    for wire in wires:
        schemas.update(_error_schemas(wire))
    paths: dict[str, Any] = {}
    for wire in wires:
        paths.update(_paths(wire))
    paths[spec.RESULTS_PREFIX + "{file}"] = _results_path()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "imggw asynchronous image-generation gateway (reference)",
            "version": VERSION,
            "description": _ABOUT,
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": spec.BEARER.lower()}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
