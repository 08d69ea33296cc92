"""The gateway codec of both surfaces: submit requests read strictly, answers written, routes
matched, all from the facts in ``spec``. The reference gateway uses only this, and the SDK's
``surfaces`` module reads what this writes from the same facts, so the two cannot drift apart.

Reason codes, their statuses and messages: the table in :mod:`.reasons` (``help()`` on it
renders the table). A refusal is one of its rows, with a message that names the field and
the rule where there is one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._core import reasons, rules, spec
from .._core.models import ImageRequest, TaskError, TaskStatus
from .._core.reasons import Reason
from .._core.spec import BETA, MessageEnvelope, Operation, Surface, SurfaceSpec
from .._core.surfaces import encode_json
from .._core.text import json_loads


@dataclass(frozen=True, slots=True)
class Route:
    """A gateway endpoint: its method, path template, surface and operation."""

    method: str
    template: str
    surface: Surface
    operation: Operation  # a submit or a query


ROUTES = tuple(
    route
    for wire in spec.SPECS.values()
    for route in (
        Route("POST", wire.submit_path, wire.name, spec.SUBMIT),
        Route("GET", wire.query_path, wire.name, spec.QUERY),
    )
)


def _template_prefix(template: str) -> str | None:
    """The fixed part of a template that names its task in the path, else None."""
    head, brace, _ = template.partition("{")
    return head if brace else None


def match_route(path: str) -> Route | None:
    """The endpoint a path names, whatever the method; None for no endpoint."""
    for route in ROUTES:
        prefix = _template_prefix(route.template)
        if path == route.template or (prefix is not None and path.startswith(prefix)):
            return route
    return None


def surface_of(path: str) -> Surface:
    """The surface whose error shape a path gets (B for paths of neither)."""
    for wire in spec.SPECS.values():
        if path.startswith(wire.prefix + "/"):
            return wire.name
    return BETA


def query_task_id(surface: Surface, path: str, query: Mapping[str, str]) -> str:
    """The task id a query names: A's ``taskId`` parameter, B's last path segment."""
    wire = spec.of(surface)
    where, name = wire.task_id_param
    if where == "query":
        return query.get(name, "")
    prefix = _template_prefix(wire.query_path)
    assert prefix is not None, "a task named in the path needs a template"
    return path[len(prefix) :]


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The key of an ``Authorization: Bearer`` header (lower-case header names), or None."""
    scheme, _, token = headers.get(spec.AUTHORIZATION_HEADER.lower(), "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == spec.BEARER.lower() and token else None


@dataclass(frozen=True, slots=True)
class Refusal:
    """An error answer: HTTP status, stable reason code, safe public message."""

    status: int
    code: str
    message: str


def refuse(reason: Reason, message: str | None = None) -> Refusal:
    """The refusal of a reason: its status and code, and ``message`` or the table's own."""
    return Refusal(reason.status, reason.code, reason.message if message is None else message)


def _name(value: object) -> str:
    """A field name from the request, fit to quote: short and printable."""
    text = "".join(c for c in str(value) if c.isprintable())
    return text if len(text) <= 40 else text[:39] + "…"


Shape = dict[str, "Shape | None"]


def request_shape(surface: Surface) -> Shape:
    """The submit body's fields as a tree, in body order: a name maps to None for a value, to
    the tree of its fields for an object.
    """
    tree: Shape = {}
    for path in spec.of(surface).request.values():
        *parents, leaf = path.split(".")
        place = tree
        for parent in parents:
            child = place.setdefault(parent, {})
            assert child is not None
            place = child
        place[leaf] = None
    return tree


def _field(data: dict[str, Any], path: str) -> Any:
    for name in path.split("."):
        data = data[name]
    return data


def read_submit_request(surface: Surface, body: bytes) -> ImageRequest | Refusal:
    """The request a submit body carries, checked strictly in the surface's wire form."""
    if len(body) > rules.BODY_MAX_BYTES:
        return refuse(reasons.BODY_TOO_LARGE, f"the body exceeds {rules.BODY_MAX_BYTES} bytes")
    try:
        # Repeated keys are refused: what a proxy checked must be what is billed.
        data = json_loads(body, unique_keys=True)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return refuse(reasons.INVALID_JSON)
    shape = _check_shape(data, request_shape(surface), "")
    if shape is not None:
        return shape
    wire = spec.of(surface)
    path = wire.request
    if _field(data, path["model"]) != wire.model:
        return refuse(reasons.INVALID_MODEL, f"{path['model']}: must be {wire.model}")
    if "n" in path:
        n = _field(data, path["n"])
        if type(n) is not int or n != spec.N:
            return refuse(reasons.INVALID_N, f"{path['n']}: must be {spec.N}")
    prompt, ratio, resolution = (
        _field(data, path[name]) for name in ("prompt", "aspect_ratio", "resolution")
    )
    wire_resolutions = tuple(wire.wire_resolution(r) for r in rules.RESOLUTIONS)
    violations = rules.check_prompt(prompt) + rules.check_image(
        ratio, resolution, resolutions=wire_resolutions
    )
    if violations:
        first = violations[0]
        return refuse(reasons.BY_CODE[first.code], f"{path[first.field]}: {first.rule}")
    return ImageRequest(prompt, ratio, resolution)


def _check_shape(data: dict[str, Any], shape: Shape, prefix: str) -> Refusal | None:
    """Unknown fields first, then missing ones (the first of each, sorted), then each nested
    object in turn."""
    unknown = sorted(str(k) for k in data if k not in shape)
    if unknown:
        return refuse(reasons.UNKNOWN_FIELD, f"{prefix}{_name(unknown[0])}: unknown field")
    missing = sorted(shape.keys() - data.keys())
    if missing:
        return refuse(reasons.MISSING_FIELD, f"{prefix}{missing[0]}: required")
    for name, inner in shape.items():
        if inner is not None:
            if not isinstance(data[name], dict):
                return refuse(reasons.MISSING_FIELD, f"{prefix}{name}: must be an object")
            nested = _check_shape(data[name], inner, f"{prefix}{name}.")
            if nested is not None:
                return nested
    return None


def canonical(body: bytes) -> bytes:
    """The body in one canonical JSON form: idempotency compares requests, not whitespace.
    A body that is not sound JSON is its own canonical form.
    """
    try:
        return json.dumps(json_loads(body), sort_keys=True, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        return body


def request_digest(surface: Surface, body: bytes) -> bytes:
    """What an ``Idempotency-Key`` is bound to: a digest of the surface and the canonical body.
    Keys belong to the API key, not to a surface, so the same key on the other surface is
    another wire request (a conflict), while an identical retry on the same surface replays.
    """
    return hashlib.sha256(surface.encode() + b"\n" + canonical(body)).digest()


def _answer(wire: SurfaceSpec, data: Any) -> dict[str, Any]:
    """A successful answer around its ``data``, in the surface's envelope."""
    envelope = wire.envelope
    if isinstance(envelope, MessageEnvelope):
        return {envelope.code: 200, envelope.message: envelope.success, envelope.data: data}
    return {envelope.code: 200, envelope.data: data}


def submit_response(surface: Surface, task_id: str) -> bytes:
    """The answer to an accepted submit (and to its replays)."""
    wire = spec.of(surface)
    answer = wire.submit_answer
    item: dict[str, Any] = {}
    if answer.status is not None:
        name, value = answer.status
        item[name] = value
    item[answer.task_id] = task_id
    return encode_json(_answer(wire, [item] if answer.in_list else item))


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
    surface: Surface,
    view: TaskView,
    *,
    extra_states: bool = False,
    omit_progress: bool = False,
    omit_charge: bool = False,
) -> bytes:
    """The answer to a query: the task record in the surface's fields. ``extra_states``: the
    real providers' extra state names (``spec.SurfaceSpec.quirk_states``); ``omit_progress``:
    no ``progress`` field, as real providers often send; ``omit_charge``: no credits nor cost,
    as a gateway that bills elsewhere sends.
    """
    wire = spec.of(surface)
    fields = wire.record
    state = wire.written[view.status.value]
    if extra_states and (view.late or not wire.quirk_states_late):
        state = wire.quirk_states.get(view.status.value, state)
    done = view.status is TaskStatus.SUCCEEDED
    data: dict[str, Any] = {fields.id: view.id, fields.state: state}
    if fields.result_urls:
        result: Any = {spec.RESULT_URLS: list(view.urls)} if done else None
    else:
        result = {spec.RESULT_IMAGES: [_image(view)]} if done else None
    if fields.result_as_text:
        result = json.dumps(result) if result is not None else ""
    data[fields.result] = result
    if not omit_charge:
        if fields.cost is not None:
            data[fields.cost] = view.cost
        data[fields.credits] = f"{view.credits:g}" if fields.credits_as_text else view.credits
    error = view.error
    if fields.error is None:  # fields of the record itself, empty unless failed
        data[fields.fail_code] = error.code if error else ""
        data[fields.fail_message] = error.message if error else ""
    elif error is not None:
        data[fields.error] = {fields.fail_code: error.code, fields.fail_message: error.message}
    if not omit_progress:
        data[fields.progress] = view.progress
    return encode_json(_answer(wire, data))


def _image(view: TaskView) -> dict[str, Any]:
    image: dict[str, Any] = {spec.IMAGE_URL: list(view.urls)}
    if view.expires_at is not None:
        image[spec.IMAGE_EXPIRES_AT] = view.expires_at
    return image


def error_body(
    surface: Surface, refusal: Refusal, *, http_200: bool = False, omit_code: bool = False
) -> tuple[int, bytes]:
    """The HTTP status and body of an error. ``http_200``: surface A's quirk of answering every
    error with HTTP 200 and the code only in the body. ``omit_code``: surface B without the
    top-level ``code``.
    """
    envelope = spec.of(surface).envelope
    if isinstance(envelope, MessageEnvelope):
        message = refusal.message
        if refusal.code.startswith(envelope.leading_reasons):
            # No string reason in this envelope: the reason leads the message (DESIGN 8).
            message = f"{refusal.code}: {message}"
        body: dict[str, Any] = {
            envelope.code: refusal.status,
            envelope.message: message,
            envelope.data: None,
        }
        return (200 if http_200 else refusal.status), encode_json(body)
    detail = {envelope.error_code: refusal.code, envelope.error_message: refusal.message}
    body = {envelope.error: detail}
    if not omit_code:
        body = {envelope.code: refusal.status, **body}
    return refusal.status, encode_json(body)
