"""Every reason code the project knows, in one table: HTTP status, public message, retry class.

A reason code is the stable word an error answer carries (B's ``error.code``; on A the status
in ``code``, and the idempotency reasons at the start of ``msg``). The gateway refuses with
these rows, the SDK classifies retries by them (``retry.classify``), the request rules name
their codes from them (``rules``), and the OpenAPI document declares, per route, the statuses
of the rows that route sends. ``message`` is what the gateway says when it has nothing more
particular to say (a rule names the field instead).

Retry classes (what the SDK does on meeting the reason):

- ``retried``: retried; the request may have been applied, so a submit keeps its key and an
  exhausted one is an unknown outcome;
- ``retried, not executed``: retried; nothing was done;
- ``stop, outcome unknown``: not retried, and a submit's outcome is unknown (keep the key);
- ``never``: not retried; nothing was done.

A row marked *decides* (the idempotency reasons, DESIGN 8) is read before the status: a reused
key is never retried even when a gateway answers it with 409.

An error answer that names no reason (A's envelope has no string reason; a proxy's page has
none either) gets one by :func:`for_status` (DESIGN 18): the row whose public message it
repeats word for word, else the one B sends for its status (:data:`BY_STATUS`; any 5xx
``server_error``). So one condition has one code on both surfaces.

The table, as rendered at import (``help()`` shows it):
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from .spec import QUERY, RESULT, SUBMIT, Operation


class Retry(Enum):
    """What the SDK does on meeting a reason: retry or not, and whether the failed request may
    have been applied.
    """

    RETRIED = "retried"
    RETRIED_NOT_EXECUTED = "retried, not executed"
    STOP_UNKNOWN = "stop, outcome unknown"
    NEVER = "never"

    @property
    def retried(self) -> bool:
        """Whether the request is tried again."""
        return self in (Retry.RETRIED, Retry.RETRIED_NOT_EXECUTED)

    @property
    def unknown(self) -> bool:
        """Whether the failed request may have been applied."""
        return self in (Retry.RETRIED, Retry.STOP_UNKNOWN)


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason code.

    ``routes`` are the documented routes on which the reference gateway answers with it (none
    for an answer off every route, or one only other gateways send); ``retry_after``: that
    answer carries ``Retry-After``; ``decides``: the reason, not the HTTP status, decides the
    retry.
    """

    code: str
    status: int
    message: str
    retry: Retry
    when: str
    routes: frozenset[Operation] = frozenset()
    retry_after: bool = False
    decides: bool = False


def _on(*routes: Operation) -> frozenset[Operation]:
    return frozenset(routes)


_ANY = _on(SUBMIT, QUERY, RESULT)
_NEVER = Retry.NEVER

INVALID_REQUEST = Reason(
    "invalid_request",
    400,
    "The request is invalid.",
    _NEVER,
    "a request refused as invalid (400 or 422) with no more particular reason; also the code of "
    "the SDK's own refusals that name none",
)
INVALID_JSON = Reason(
    "invalid_json",
    400,
    "the body must be one JSON object without repeated keys",
    _NEVER,
    "the body is not one well-formed JSON object (bad syntax or encoding, nesting too deep to "
    "parse, a repeated key)",
    _on(SUBMIT),
)
INVALID_IDEMPOTENCY_KEY = Reason(
    "invalid_idempotency_key",
    400,
    "The Idempotency-Key header breaks a rule.",
    _NEVER,
    "the Idempotency-Key is empty, longer than 255 characters, or not printable ASCII without "
    "surrounding spaces",
    _on(SUBMIT),
)
INVALID_TASK_ID = Reason(
    "invalid_task_id",
    400,
    "Invalid task id.",
    _NEVER,
    "the task id is not a positive decimal number without leading zeros",
    _on(QUERY),
)
UNAUTHORIZED = Reason(
    "unauthorized",
    401,
    "A valid Bearer API key is required.",
    _NEVER,
    "no Authorization: Bearer header, or an unknown key",
    _on(SUBMIT, QUERY),
)
INSUFFICIENT_CREDITS = Reason(
    "insufficient_credits",
    402,
    "The account's credits do not cover this request.",
    _NEVER,
    "the key's balance cannot pay for the request (nothing is created)",
    _on(SUBMIT),
)
FORBIDDEN = Reason(
    "forbidden",
    403,
    "The key may not do this.",
    _NEVER,
    "the key is not allowed this request",
)
TASK_NOT_FOUND = Reason(
    "task_not_found",
    404,
    "No such task.",
    _NEVER,
    "an unknown task, or another key's task (indistinguishable)",
    _on(QUERY),
)
NOT_FOUND = Reason("not_found", 404, "No such route.", _NEVER, "no such route")
METHOD_NOT_ALLOWED = Reason(
    "method_not_allowed",
    405,
    "The route does not take this method.",
    _NEVER,
    "a route called with another method (the Allow header names the right one)",
)
IDEMPOTENCY_IN_PROGRESS = Reason(
    "idempotency_in_progress",
    409,
    "A request with this Idempotency-Key is in progress.",
    Retry.RETRIED,
    "the first request with the same key is still being processed",
    _on(SUBMIT),
    retry_after=True,
)
RESULT_EXPIRED = Reason(
    "result_expired",
    410,
    "The result is no longer kept.",
    _NEVER,
    "a result past its retention window (result links answer it in plain text)",
)
BODY_TOO_LARGE = Reason(
    "body_too_large",
    413,
    "The request body is too large.",
    _NEVER,
    "the body exceeds 256 KiB",
    _on(SUBMIT),
)
UNKNOWN_FIELD = Reason(
    "unknown_field",
    422,
    "A field the schema does not define.",
    _NEVER,
    "a field the schema does not define",
    _on(SUBMIT),
)
MISSING_FIELD = Reason(
    "missing_field",
    422,
    "A required field is missing.",
    _NEVER,
    "a required field is absent (or A's input is not an object)",
    _on(SUBMIT),
)
INVALID_MODEL = Reason(
    "invalid_model",
    422,
    "The model is not this surface's model.",
    _NEVER,
    "the model constant is wrong",
    _on(SUBMIT),
)
INVALID_N = Reason(
    "invalid_n",
    422,
    "n must be 1.",
    _NEVER,
    "n is not the integer 1 (B)",
    _on(SUBMIT),
)
INVALID_PROMPT = Reason(
    "invalid_prompt",
    422,
    "The prompt breaks a rule.",
    _NEVER,
    "prompt length, type, blankness (ECMA-262 \\S) or surrogate code points",
    _on(SUBMIT),
)
INVALID_ASPECT_RATIO = Reason(
    "invalid_aspect_ratio",
    422,
    "The aspect ratio is not one of the 16 allowed.",
    _NEVER,
    "the aspect ratio is outside the 16",
    _on(SUBMIT),
)
INVALID_RESOLUTION = Reason(
    "invalid_resolution",
    422,
    "The resolution is not in this surface's wire form.",
    _NEVER,
    "the resolution is not the surface's exact wire form",
    _on(SUBMIT),
)
UNSUPPORTED_COMBINATION = Reason(
    "unsupported_combination",
    422,
    "The aspect ratio does not allow this resolution.",
    _NEVER,
    "a resolution the aspect ratio does not allow",
    _on(SUBMIT),
)
IDEMPOTENCY_KEY_REUSED = Reason(
    "idempotency_key_reused",
    422,
    "This Idempotency-Key was used with a different request.",
    _NEVER,
    "the key is bound to another request, on either surface (some gateways say 409)",
    _on(SUBMIT),
    decides=True,
)
RATE_LIMITED = Reason(
    "rate_limited",
    429,
    "Too many requests; slow down.",
    Retry.RETRIED_NOT_EXECUTED,
    "over the key's request limit, or injected",
    _ANY,
    retry_after=True,
)
INTERNAL_ERROR = Reason(
    "internal_error",
    500,
    "The gateway failed.",
    Retry.RETRIED,
    "the gateway failed (injected; nothing was processed)",
    _ANY,
)
IDEMPOTENCY_RESULT_INDETERMINATE = Reason(
    "idempotency_result_indeterminate",
    500,
    "The outcome of the first request with this Idempotency-Key is unknown.",
    Retry.STOP_UNKNOWN,
    "the gateway cannot tell whether the key's request was applied",
    decides=True,
)
SERVER_ERROR = Reason(
    "server_error",
    500,
    "The server failed.",
    Retry.RETRIED,
    "a 5xx with no more particular reason (a proxy's error page, say)",
)
BAD_GATEWAY = Reason(
    "bad_gateway",
    502,
    "The upstream provider failed.",
    Retry.RETRIED,
    "the upstream provider failed (injected; nothing was processed)",
    _ANY,
)
SERVICE_UNAVAILABLE = Reason(
    "service_unavailable",
    503,
    "The gateway is overloaded.",
    Retry.RETRIED,
    "the gateway is overloaded (injected; nothing was processed)",
    _ANY,
)
IDEMPOTENCY_UNAVAILABLE = Reason(
    "idempotency_unavailable",
    503,
    "The request was not executed; try again.",
    Retry.RETRIED_NOT_EXECUTED,
    "the gateway could not check the key and did nothing",
    decides=True,
)
GATEWAY_TIMEOUT = Reason(
    "gateway_timeout",
    504,
    "The upstream provider timed out.",
    Retry.RETRIED,
    "the upstream provider timed out (injected; nothing was processed)",
    _ANY,
)

REASONS: tuple[Reason, ...] = (
    INVALID_REQUEST,
    INVALID_JSON,
    INVALID_IDEMPOTENCY_KEY,
    INVALID_TASK_ID,
    UNAUTHORIZED,
    INSUFFICIENT_CREDITS,
    FORBIDDEN,
    TASK_NOT_FOUND,
    NOT_FOUND,
    METHOD_NOT_ALLOWED,
    IDEMPOTENCY_IN_PROGRESS,
    RESULT_EXPIRED,
    BODY_TOO_LARGE,
    UNKNOWN_FIELD,
    MISSING_FIELD,
    INVALID_MODEL,
    INVALID_N,
    INVALID_PROMPT,
    INVALID_ASPECT_RATIO,
    INVALID_RESOLUTION,
    UNSUPPORTED_COMBINATION,
    IDEMPOTENCY_KEY_REUSED,
    RATE_LIMITED,
    INTERNAL_ERROR,
    SERVER_ERROR,
    IDEMPOTENCY_RESULT_INDETERMINATE,
    BAD_GATEWAY,
    SERVICE_UNAVAILABLE,
    IDEMPOTENCY_UNAVAILABLE,
    GATEWAY_TIMEOUT,
)
BY_CODE: Mapping[str, Reason] = MappingProxyType({r.code: r for r in REASONS})

# The reason B sends for each status when it has no more particular one (DESIGN 18): what an
# error answer that names no reason means, on either surface. Any other 5xx is SERVER_ERROR.
BY_STATUS: Mapping[int, Reason] = MappingProxyType(
    {
        400: INVALID_REQUEST,
        401: UNAUTHORIZED,
        402: INSUFFICIENT_CREDITS,
        403: FORBIDDEN,
        404: TASK_NOT_FOUND,
        405: METHOD_NOT_ALLOWED,
        409: IDEMPOTENCY_IN_PROGRESS,
        410: RESULT_EXPIRED,
        413: BODY_TOO_LARGE,
        422: INVALID_REQUEST,
        429: RATE_LIMITED,
    }
)
_BY_MESSAGE: Mapping[tuple[int, str], Reason] = MappingProxyType(
    {(r.status, r.message): r for r in REASONS}
)


def find(code: object) -> Reason | None:
    """The row of a reason code, or None for a code the table does not hold."""
    return BY_CODE.get(code) if isinstance(code, str) else None


def for_status(status: int, message: str | None = None) -> Reason | None:
    """The reason of an error answer that names none: the row of ``status`` whose public
    message ``message`` repeats word for word (a gateway that speaks this table: the SDK can
    tell the rule), else the row B sends for the status (:data:`BY_STATUS`; any 5xx
    ``server_error``); None for a status that has no row (408, say).
    """
    if message is not None:
        said = _BY_MESSAGE.get((status, message))
        if said is not None:
            return said
    if 500 <= status <= 599:
        return SERVER_ERROR
    return BY_STATUS.get(status)


def table(rows: Iterable[Reason] = REASONS) -> str:
    """The rows as a reStructuredText table: code, status, retry class, when."""
    lines = [
        (
            f"``{r.code}``" + (" (decides)" if r.decides else ""),
            str(r.status),
            r.retry.value,
            r.when,
        )
        for r in rows
    ]
    heads = ("code", "status", "retry", "when")
    widths = [max(len(head), *(len(line[i]) for line in lines)) for i, head in enumerate(heads)]
    rule = "  ".join("=" * w for w in widths)
    out = [rule, "  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip(), rule]
    out += [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
    return "\n".join([*out, rule])


if __doc__ is not None:  # None under python -OO
    __doc__ += "\n" + table() + "\n"
