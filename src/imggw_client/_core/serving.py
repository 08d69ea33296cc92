"""The gateway side of both surfaces: reading submit requests strictly, writing submit
responses, task records and error bodies. The reference gateway uses only this, and the SDK's
``surfaces`` module reads what this writes, so the two cannot drift apart.

Reason codes (``error.code`` on B; the numeric ``code`` and ``msg`` on A):

==========================  ======  ==============================================
code                        status  when
==========================  ======  ==============================================
``invalid_json``            400     the body is not one well-formed JSON object (bad
                                    syntax or encoding, nesting too deep to parse, a
                                    repeated key)
``body_too_large``          413     the body exceeds 256 KiB
``unknown_field``           422     a field the schema does not define
``missing_field``           422     a required field is absent
``invalid_model``           422     the ``model`` constant is wrong
``invalid_n``               422     ``n`` is not the integer 1 (B)
``invalid_prompt``          422     prompt length, type, blankness (ECMA-262 ``\\S``)
                                    or surrogate code points
``invalid_aspect_ratio``    422     ``size`` / ``input.aspect_ratio`` outside the 16
``invalid_resolution``      422     not the surface's exact wire form
``unsupported_combination`` 422     a resolution the aspect ratio does not allow
``rate_limited``            429     over the key's request limit (Retry-After)
==========================  ======  ==============================================
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._config import Surface
from .._models import ImageRequest, TaskError, TaskStatus
from . import jsonio, rules
from .surfaces import (
    ALPHA,
    ALPHA_MODEL,
    ALPHA_QUERY_PATH,
    ALPHA_SUBMIT_PATH,
    AUTHORIZATION_HEADER,
    BETA,
    BETA_MODEL,
    BETA_QUERY_PATH,
    BETA_SUBMIT_PATH,
    encode_json,
)

INVALID_JSON = "invalid_json"
UNKNOWN_FIELD = "unknown_field"
MISSING_FIELD = "missing_field"
INVALID_MODEL = "invalid_model"
INVALID_N = "invalid_n"
RATE_LIMITED = "rate_limited"

WIRE_STATES: dict[Surface, dict[TaskStatus, str]] = {
    ALPHA: {
        TaskStatus.PENDING: "waiting",
        TaskStatus.RUNNING: "generating",
        TaskStatus.SUCCEEDED: "success",
        TaskStatus.FAILED: "fail",
    },
    BETA: {
        TaskStatus.PENDING: "pending",
        TaskStatus.RUNNING: "processing",
        TaskStatus.SUCCEEDED: "completed",
        TaskStatus.FAILED: "failed",
    },
}
# The extra active states real providers use (the ``extra_states`` quirk).
EXTRA_STATES: dict[Surface, dict[TaskStatus, str]] = {
    ALPHA: {TaskStatus.PENDING: "queuing"},
    BETA: {TaskStatus.PENDING: "submitted", TaskStatus.RUNNING: "in_progress"},
}
_FIELDS: dict[Surface, dict[str, str]] = {
    ALPHA: {
        "prompt": "input.prompt",
        "aspect_ratio": "input.aspect_ratio",
        "resolution": "input.resolution",
    },
    BETA: {"prompt": "prompt", "aspect_ratio": "size", "resolution": "resolution"},
}
WIRE_RESOLUTIONS: dict[Surface, tuple[str, ...]] = {
    ALPHA: tuple(r.upper() for r in rules.RESOLUTIONS),
    BETA: rules.RESOLUTIONS,
}


@dataclass(frozen=True, slots=True)
class Route:
    """A gateway endpoint: its method, path template, surface and operation."""

    method: str
    template: str
    surface: Surface
    operation: str  # "submit" or "query"


ROUTES = (
    Route("POST", ALPHA_SUBMIT_PATH, ALPHA, "submit"),
    Route("GET", ALPHA_QUERY_PATH, ALPHA, "query"),
    Route("POST", BETA_SUBMIT_PATH, BETA, "submit"),
    Route("GET", BETA_QUERY_PATH, BETA, "query"),
)
_BETA_TASKS = BETA_QUERY_PATH.split("{id}")[0]
_ALPHA_PREFIX = "/" + ALPHA + "/"


def match_route(path: str) -> Route | None:
    """The endpoint a path names, whatever the method; None for no endpoint."""
    for route in ROUTES:
        if path == route.template or (
            route.template == BETA_QUERY_PATH and path.startswith(_BETA_TASKS)
        ):
            return route
    return None


def surface_of(path: str) -> Surface:
    """The surface whose error shape a path gets (B for paths of neither)."""
    return ALPHA if path.startswith(_ALPHA_PREFIX) else BETA


def query_task_id(surface: Surface, path: str, query: Mapping[str, str]) -> str:
    """The task id a query names: A's ``taskId`` parameter, B's last path segment."""
    if surface == ALPHA:
        return query.get("taskId", "")
    return path[len(_BETA_TASKS) :]


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The key of an ``Authorization: Bearer`` header (lower-case header names), or None."""
    scheme, _, token = headers.get(AUTHORIZATION_HEADER.lower(), "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True, slots=True)
class Refusal:
    """An error answer: HTTP status, stable reason code, safe public message."""

    status: int
    code: str
    message: str


def _name(value: object) -> str:
    """A field name from the request, fit to quote: short and printable."""
    text = "".join(c for c in str(value) if c.isprintable())
    return text if len(text) <= 40 else text[:39] + "…"


def read_submit_request(surface: Surface, body: bytes) -> ImageRequest | Refusal:
    """The request a submit body carries, checked strictly in the surface's wire form."""
    if len(body) > rules.BODY_MAX_BYTES:
        return Refusal(413, rules.BODY_TOO_LARGE, f"the body exceeds {rules.BODY_MAX_BYTES} bytes")
    try:
        # Repeated keys are refused: what a proxy checked must be what is billed.
        data = jsonio.loads(body, unique_keys=True)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return Refusal(400, INVALID_JSON, "the body must be one JSON object without repeated keys")
    if surface == ALPHA:
        shape = _check_fields(data, {"model", "input"}, "")
        if shape is None:
            fields = data["input"]
            if not isinstance(fields, dict):
                return Refusal(422, MISSING_FIELD, "input: must be an object")
            shape = _check_fields(fields, {"prompt", "resolution", "aspect_ratio"}, "input.")
        model, ratio_key = ALPHA_MODEL, "aspect_ratio"
    else:
        fields = data
        shape = _check_fields(data, {"model", "prompt", "size", "resolution", "n"}, "")
        model, ratio_key = BETA_MODEL, "size"
    if shape is not None:
        return shape
    if data["model"] != model:
        return Refusal(422, INVALID_MODEL, f"model: must be {model}")
    if surface == BETA and (type(data["n"]) is not int or data["n"] != 1):
        return Refusal(422, INVALID_N, "n: must be 1")
    prompt, ratio, resolution = fields["prompt"], fields[ratio_key], fields["resolution"]
    violations = rules.check_prompt(prompt) + rules.check_image(
        ratio, resolution, resolutions=WIRE_RESOLUTIONS[surface]
    )
    if violations:
        first = violations[0]
        return Refusal(422, first.code, f"{_FIELDS[surface][first.field]}: {first.rule}")
    return ImageRequest(prompt, ratio, resolution)


def _check_fields(data: dict[str, Any], allowed: set[str], prefix: str) -> Refusal | None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        return Refusal(422, UNKNOWN_FIELD, f"{prefix}{_name(unknown[0])}: unknown field")
    missing = sorted(allowed - data.keys())
    if missing:
        return Refusal(422, MISSING_FIELD, f"{prefix}{missing[0]}: required")
    return None


def canonical(body: bytes) -> bytes:
    """The body in one canonical JSON form: idempotency compares requests, not whitespace.
    A body that is not sound JSON is its own canonical form.

    Example::

        canonical(b'{"b": 1, "a": 2}')   # b'{"a":2,"b":1}'
    """
    try:
        return json.dumps(jsonio.loads(body), sort_keys=True, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        return body


def request_fingerprint(surface: Surface, body: bytes) -> bytes:
    """What an ``Idempotency-Key`` is bound to: the surface and the canonical body. Keys
    belong to the API key, not to a surface, so the same key on the other surface is another
    wire request (a conflict), while an identical retry on the same surface replays.

    Example::

        request_fingerprint("beta", body) != request_fingerprint("alpha", body)
    """
    return hashlib.sha256(surface.encode() + b"\n" + canonical(body)).digest()


def submit_response(surface: Surface, task_id: str) -> bytes:
    if surface == ALPHA:
        return encode_json({"code": 200, "msg": "success", "data": {"taskId": task_id}})
    return encode_json({"code": 200, "data": [{"status": "submitted", "task_id": task_id}]})


@dataclass(frozen=True, slots=True)
class TaskView:
    """What the gateway knows of a task at one moment, independent of the surface."""

    id: str
    status: TaskStatus
    progress: int
    urls: tuple[str, ...]
    credits: float
    cost: float
    error: TaskError | None
    late: bool = False  # in the second half of its phase (for the extra-states quirk)
    expires_at: int | None = None  # Unix seconds at which the links stop working


def task_record(
    surface: Surface, view: TaskView, *, extra_states: bool = False, omit_progress: bool = False
) -> bytes:
    state = WIRE_STATES[surface][view.status]
    if extra_states and (surface == BETA or view.late):
        state = EXTRA_STATES[surface].get(view.status, state)
    done = view.status is TaskStatus.SUCCEEDED
    data: dict[str, Any]
    if surface == ALPHA:
        data = {
            "taskId": view.id,
            "state": state,
            "resultJson": json.dumps({"resultUrls": list(view.urls)}) if done else "",
            "creditsConsumed": f"{view.credits:g}",
            "failCode": view.error.code if view.error else "",
            "failMsg": view.error.message if view.error else "",
        }
        body: dict[str, Any] = {"code": 200, "msg": "success", "data": data}
    else:
        data = {
            "id": view.id,
            "status": state,
            "result": {"images": [_image(view)]} if done else None,
            "cost": view.cost,
            "credits_cost": view.credits,
        }
        if view.error is not None:
            data["error"] = {"code": view.error.code, "message": view.error.message}
        body = {"code": 200, "data": data}
    if not omit_progress:
        data["progress"] = view.progress
    return encode_json(body)


def _image(view: TaskView) -> dict[str, Any]:
    image: dict[str, Any] = {"url": list(view.urls)}
    if view.expires_at is not None:
        image["expires_at"] = view.expires_at
    return image


def error_body(
    surface: Surface, refusal: Refusal, *, http_200: bool = False, omit_code: bool = False
) -> tuple[int, bytes]:
    """The HTTP status and body of an error. ``http_200``: surface A's quirk of answering every
    error with HTTP 200 and the code only in the body. ``omit_code``: surface B without the
    top-level ``code``."""
    if surface == ALPHA:
        message = refusal.message
        if refusal.code.startswith("idempotency_"):
            # A has no string reason: idempotency reasons lead the message (DESIGN 8).
            message = f"{refusal.code}: {message}"
        body: dict[str, Any] = {"code": refusal.status, "msg": message, "data": None}
        return (200 if http_200 else refusal.status), encode_json(body)
    body = {"error": {"code": refusal.code, "message": refusal.message}}
    if not omit_code:
        body = {"code": refusal.status, **body}
    return refusal.status, encode_json(body)
