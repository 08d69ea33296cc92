"""The wire facts of both surfaces, as data: the one module that spells them (SPEC 2, 4, 7).

One frozen :class:`SurfaceSpec` per surface holds its paths, model, where each request field
goes, the submit answer, the task record's field names, the state map and the error envelope.
Everything that speaks the protocol derives from it: the client codec (``surfaces``), the
gateway codec (``serving``) and the OpenAPI document (``mock._openapi``); reason codes are
the table in ``reasons``. ``tests/core/test_wire_facts.py`` fails when another module spells a
path, a wire field, a state or a reason code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Surface = Literal["alpha", "beta"]
ALPHA: Surface = "alpha"
BETA: Surface = "beta"

# What the reference gateway answers on, by kind: a submit, a query, a result link. These name
# the routes in the reason table and in request limits, never the wire.
Operation = Literal["submit", "query", "result"]
SUBMIT: Operation = "submit"
QUERY: Operation = "query"
RESULT: Operation = "result"

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"  # "true" on a replay of the first answer to a key
AUTHORIZATION_HEADER = "Authorization"
BEARER = "Bearer"
RETRY_AFTER_HEADER = "Retry-After"

N = 1  # surface B's ``n``: the only value SPEC 2.4 allows

# A result object. The gateway writes A's as ``{"resultUrls": [url, ...]}`` (serialised in
# ``resultJson``) and B's as ``{"images": [{"url": [url, ...], "expires_at": t}]}``; the client
# reads every one of these shapes on either surface, because real providers vary (DESIGN 4).
RESULT_URLS = "resultUrls"
RESULT_URL_KEYS = (RESULT_URLS, "urls")
RESULT_IMAGES = "images"
IMAGE_URL = "url"
IMAGE_EXPIRES_AT = "expires_at"

# A cancelled task fails on either surface, in either spelling (DESIGN 4).
CANCELLED_STATES = ("cancelled", "canceled")

# The reference gateway's own routes (DESIGN 5), beside the contract's: signed result links
# (``/results/<token>.png?Expires=<Unix seconds>&Signature=<hex>``), its OpenAPI document, and
# inspection for tests.
RESULTS_PREFIX = "/results/"
LINK_EXPIRES = "Expires"
LINK_SIGNATURE = "Signature"
OPENAPI_PATH = "/openapi.json"
CONTROL_PREFIX = "/_mock/"
STATS_PATH = CONTROL_PREFIX + "stats"
RESET_PATH = CONTROL_PREFIX + "reset"
ADVANCE_PATH = CONTROL_PREFIX + "advance"


@dataclass(frozen=True, slots=True)
class MessageEnvelope:
    """Every answer is ``{code, msg, data}``: ``code`` 200 and ``msg`` ``success`` on success;
    an error has the status in ``code`` (even under HTTP 200, as A's provider answers) and
    ``data`` null. There is no string reason: reason codes starting with ``leading_reasons``
    lead ``msg`` (``idempotency_key_reused: ...``, DESIGN 8).
    """

    code: str
    message: str
    data: str
    success: str
    leading_reasons: str


@dataclass(frozen=True, slots=True)
class ErrorEnvelope:
    """A success is ``{code, data}``; an error is ``{code, error: {code, message}}``, the
    top-level ``code`` sometimes left out by real providers.
    """

    code: str
    data: str
    error: str
    error_code: str
    error_message: str


Envelope = MessageEnvelope | ErrorEnvelope


@dataclass(frozen=True, slots=True)
class SubmitAnswer:
    """Where a submit's answer (its ``data``) puts the task id.

    ``in_list``: ``data`` is a list of exactly one object (B). ``status``: a constant field
    written beside the id, as ``(name, value)`` (B's ``status: submitted``). ``constant_code``:
    the contract states the answer's ``code`` as the constant 200 (SPEC 2.5), not merely an
    integer.
    """

    task_id: str
    in_list: bool
    status: tuple[str, str] | None
    constant_code: bool


@dataclass(frozen=True, slots=True)
class RecordFields:
    """The field names of a task record (a query answer's ``data``), in the order the gateway
    writes them.

    ``result_as_text``: the result object travels serialised as a JSON string (A's
    ``resultJson``). ``result_urls``: the gateway writes the result as a plain URL list under
    :data:`RESULT_URLS` (A), else as :data:`RESULT_IMAGES` (B). ``credits_as_text``: credits
    travel as a string. ``cost``: None where the surface has no cost. ``error``: the object
    holding a failure's ``fail_code`` and ``fail_message``, present only on failure (B); None
    when they are fields of the record itself, empty unless failed (A).
    """

    id: str
    state: str
    progress: str
    result: str
    result_as_text: bool
    result_urls: bool
    credits: str
    credits_as_text: bool
    cost: str | None
    error: str | None
    fail_code: str
    fail_message: str


@dataclass(frozen=True, slots=True)
class SurfaceSpec:
    """Every wire fact of one surface.

    ``request`` maps each part of an image request (``model``, ``prompt``, ``resolution``,
    ``aspect_ratio``, and ``n`` where the surface has it) to its dotted path in the submit body,
    in body order. ``task_id_param`` says where a query names its task: ``("query", name)`` or
    ``("path", name)`` for the ``{name}`` in ``query_path``. ``states`` maps every state the SDK
    understands to a ``TaskStatus`` value; ``written`` is the state the gateway writes for each
    status, ``quirk_states`` the real providers' extra ones it writes under the
    ``extra_states`` quirk: from the start of a phase, or only in its second half when
    ``quirk_states_late``.
    """

    name: Surface
    prefix: str
    submit_path: str
    query_path: str
    task_id_param: tuple[Literal["query", "path"], str]
    model: str
    request: Mapping[str, str]
    resolution_case: Literal["upper", "lower"]
    submit_answer: SubmitAnswer
    record: RecordFields
    states: Mapping[str, str]
    written: Mapping[str, str]
    quirk_states: Mapping[str, str]
    quirk_states_late: bool
    envelope: Envelope

    def wire_resolution(self, resolution: str) -> str:
        """A resolution (``1k``, ``2K``, ...) in this surface's exact wire case."""
        return resolution.upper() if self.resolution_case == "upper" else resolution.lower()


def _frozen(pairs: dict[str, str]) -> Mapping[str, str]:
    return MappingProxyType(pairs)


_CANCELLED = dict.fromkeys(CANCELLED_STATES, "failed")

ALPHA_SPEC = SurfaceSpec(
    name=ALPHA,
    prefix="/alpha",
    submit_path="/alpha/api/v1/jobs/createTask",
    query_path="/alpha/api/v1/jobs/recordInfo",
    task_id_param=("query", "taskId"),
    model="imagegen-2-text-to-image",
    request=_frozen(
        {
            "model": "model",
            "prompt": "input.prompt",
            "resolution": "input.resolution",
            "aspect_ratio": "input.aspect_ratio",
        }
    ),
    resolution_case="upper",
    submit_answer=SubmitAnswer(task_id="taskId", in_list=False, status=None, constant_code=False),
    record=RecordFields(
        id="taskId",
        state="state",
        progress="progress",
        result="resultJson",
        result_as_text=True,
        result_urls=True,
        credits="creditsConsumed",
        credits_as_text=True,
        cost=None,
        error=None,
        fail_code="failCode",
        fail_message="failMsg",
    ),
    # In lifecycle order; A's provider also says `queuing` (DESIGN 1).
    states=_frozen(
        {
            "waiting": "pending",
            "queuing": "pending",
            "generating": "running",
            "success": "succeeded",
            "fail": "failed",
            **_CANCELLED,
        }
    ),
    written=_frozen(
        {"pending": "waiting", "running": "generating", "succeeded": "success", "failed": "fail"}
    ),
    quirk_states=_frozen({"pending": "queuing"}),
    quirk_states_late=True,
    envelope=MessageEnvelope(
        code="code", message="msg", data="data", success="success", leading_reasons="idempotency_"
    ),
)

BETA_SPEC = SurfaceSpec(
    name=BETA,
    prefix="/beta",
    submit_path="/beta/v1/images/generations",
    query_path="/beta/v1/tasks/{id}",
    task_id_param=("path", "id"),
    model="imagegen-2",
    request=_frozen(
        {
            "model": "model",
            "prompt": "prompt",
            "aspect_ratio": "size",
            "resolution": "resolution",
            "n": "n",
        }
    ),
    resolution_case="lower",
    submit_answer=SubmitAnswer(
        task_id="task_id", in_list=True, status=("status", "submitted"), constant_code=True
    ),
    record=RecordFields(
        id="id",
        state="status",
        progress="progress",
        result="result",
        result_as_text=False,
        result_urls=False,
        credits="credits_cost",
        credits_as_text=False,
        cost="cost",
        error="error",
        fail_code="code",
        fail_message="message",
    ),
    # In lifecycle order; B's provider also says `submitted` and `in_progress` (DESIGN 1).
    states=_frozen(
        {
            "pending": "pending",
            "submitted": "pending",
            "processing": "running",
            "in_progress": "running",
            "completed": "succeeded",
            "failed": "failed",
            **_CANCELLED,
        }
    ),
    written=_frozen(
        {
            "pending": "pending",
            "running": "processing",
            "succeeded": "completed",
            "failed": "failed",
        }
    ),
    quirk_states=_frozen({"pending": "submitted", "running": "in_progress"}),
    quirk_states_late=False,
    envelope=ErrorEnvelope(
        code="code", data="data", error="error", error_code="code", error_message="message"
    ),
)

_BY_NAME: dict[Surface, SurfaceSpec] = {ALPHA_SPEC.name: ALPHA_SPEC, BETA_SPEC.name: BETA_SPEC}
SPECS: Mapping[Surface, SurfaceSpec] = MappingProxyType(_BY_NAME)


def of(surface: Surface) -> SurfaceSpec:
    """The spec of a surface."""
    return _BY_NAME[surface]  # asked several times a request: a dict, not its read-only view
