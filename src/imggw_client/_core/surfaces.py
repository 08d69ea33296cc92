"""The client codec of both surfaces: requests built, replies read, from the facts in ``spec``.

``build_*`` turn SDK values into :class:`WireRequest` objects; ``read_*`` turn a driver's
:class:`Reply` (or :class:`TransportFailure`) into SDK values or raise the matching
:class:`ImggwError`. Decoding is lenient where the contract is loose (missing fields, extra
states, ``resultJson`` shapes) and never crashes on garbage: a reply that cannot be understood
becomes a retryable :class:`ServerError` with code ``malformed_response``. Paths, field names,
states and the error envelopes come from :mod:`.spec`, reason codes from :mod:`.reasons`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import urllib.parse
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from . import expiry, reasons, rules, spec
from .attempts import parse_retry_after
from .exceptions import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    ClientClosedError,
    ConfigurationError,
    RequestValidationError,
    ServerError,
    answer_class,
)
from .models import ImageRequest, Submission, Task, TaskError, TaskStatus, blank_when_shown
from .spec import AUTHORIZATION_HEADER as AUTHORIZATION_HEADER
from .spec import MessageEnvelope, Surface, SurfaceSpec
from .text import REDACTED, blank, json_loads, link_for_display, printable
from .wire import ClientClosed, Reply, ReplyTooLarge, TransportFailure, WireRequest

log = logging.getLogger("imggw_client")

# Codes the SDK gives its own errors, never sent by a gateway.
MALFORMED = "malformed_response"
RESPONSE_TOO_LARGE = "response_too_large"
MAX_REPLY_BYTES = 4 * 1024 * 1024  # a task record is a few KB; a reply past this is hostile
_REASON_AT_START = {
    name: re.compile(rf"\s*({re.escape(s.envelope.leading_reasons)}[a-z_]+)")
    for name, s in spec.SPECS.items()
    if isinstance(s.envelope, MessageEnvelope)
}

# Every state each surface understands, as the SDK's status.
STATES: dict[Surface, dict[str, TaskStatus]] = {
    name: {state: TaskStatus(status) for state, status in s.states.items()}
    for name, s in spec.SPECS.items()
}
CANCELLED_ERROR = TaskError(code="cancelled", message="The task was cancelled.")
UNEXPLAINED_FAILURE = TaskError(code="failed", message="The task failed without a public reason.")
_unknown_states_logged: set[str] = set()
_key_hosts_told: set[str] = set()

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
# Every header the requests built here carry: a request with no other header has no
# User-Agent of a caller's to keep.
OWN_HEADERS = frozenset({*_JSON_HEADERS, spec.IDEMPOTENCY_HEADER})
_MESSAGE_LIMIT = 300
MAX_RESULT_URLS = 64  # a task makes one image; a record listing thousands is not to be trusted
MAX_URL_CHARS = 8192


# ---------------------------------------------------------------------------- requests


def authorization(api_key: str) -> str:
    """The value of the Authorization header for a key."""
    return f"{spec.BEARER} {api_key}"


def _places(wire: SurfaceSpec) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """Where each part of a request goes in ``wire``'s submit body, in body order: the part,
    the objects that hold it, its field."""
    split = ((part, path.split(".")) for part, path in wire.request.items())
    return tuple((part, tuple(names[:-1]), names[-1]) for part, names in split)


# The dotted paths split once, not at every submit.
_BODY_PLACES = {name: _places(wire) for name, wire in spec.SPECS.items()}


def submit_body(surface: Surface, request: ImageRequest) -> dict[str, Any]:
    """The JSON body of a submit, in the wire form of ``surface`` (fields in body order)."""
    wire = spec.of(surface)
    values: dict[str, Any] = {
        "model": wire.model,
        "prompt": request.prompt,
        "resolution": wire.wire_resolution(request.resolution),
        "aspect_ratio": request.aspect_ratio,
        "n": spec.N,
    }
    body: dict[str, Any] = {}
    for name, parents, leaf in _BODY_PLACES[surface]:
        place = body
        for parent in parents:
            place = place.setdefault(parent, {})
        place[leaf] = values[name]
    return body


# The encoder json.dumps would make for these options at every call.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def encode_json(body: Any) -> bytes:
    """Compact UTF-8 JSON; identical bytes for every retry of one logical request."""
    return _COMPACT.encode(body).encode()


def _encoded_submit(body: Any) -> bytes:
    try:
        return encode_json(body)
    except UnicodeEncodeError:  # a lone surrogate: not text that can be sent (validate=False)
        raise RequestValidationError(
            "prompt", "must be valid Unicode text (no lone surrogates)", code=rules.INVALID_PROMPT
        ) from None


def build_submit(
    surface: Surface, request: ImageRequest, idempotency_key: str, *, validate: bool = True
) -> WireRequest:
    """The submit of one logical request; every retry sends these same bytes and key."""
    body = _encoded_submit(submit_body(surface, request))
    if validate and len(body) > rules.BODY_MAX_BYTES:
        raise RequestValidationError(
            "prompt",
            f"the request body would exceed {rules.BODY_MAX_BYTES} bytes",
            code=rules.BODY_TOO_LARGE,
        )
    headers = {**_JSON_HEADERS, spec.IDEMPOTENCY_HEADER: idempotency_key}
    return WireRequest("POST", spec.of(surface).submit_path, None, headers, body)


def build_query(surface: Surface, task_id: str) -> WireRequest:
    """One query of a task: by query parameter (A) or in the path (B)."""
    accept = {"Accept": "application/json"}
    wire = spec.of(surface)
    where, name = wire.task_id_param
    if where == "query":
        return WireRequest("GET", wire.query_path, {name: task_id}, accept)
    return WireRequest("GET", wire.query_path.replace("{" + name + "}", task_id), None, accept)


# ---------------------------------------------------------------------------- replies


_UNPARSED: Any = object()


def _json(content: bytes | str) -> Any:
    try:
        return json_loads(content)
    except ValueError:
        return None


def safe_message(value: object, secrets: tuple[str, ...] = ()) -> str | None:
    """A public message fit to show: text only, one line, bounded, secrets blanked."""
    if not isinstance(value, str):
        return None
    text = blank(" ".join("".join(c if c.isprintable() else " " for c in value).split()), secrets)
    if len(text) > _MESSAGE_LIMIT:
        text = text[: _MESSAGE_LIMIT - 1] + "…"
    return text or None


def _api_error(
    surface: Surface,
    status: int,
    code: str | None,
    message: str | None,
    reply: Reply,
    now: float,
) -> APIError:
    cls = answer_class(status, code)
    text = message or f"the gateway answered HTTP {status}"
    if code is None:  # one condition, one code on both surfaces (DESIGN 18)
        reason = reasons.for_status(status, message)
        code = reason.code if reason is not None else None
    return cls(
        text,
        status_code=status,
        code=code,
        surface=surface,
        retry_after=parse_retry_after(reply.headers.get(spec.RETRY_AFTER_HEADER.lower()), now),
    )


def read_error(
    surface: Surface,
    reply: Reply,
    now: float,
    secrets: tuple[str, ...] = (),
    parsed: Any = _UNPARSED,
) -> APIError | None:
    """The error a reply carries, or None. A ``code``/``msg`` envelope (A) is an error by its
    body ``code`` even on HTTP 200; an ``error`` object envelope (B) is read with or without a
    top-level ``code``. ``parsed`` is the body already decoded, if the caller has it.
    """
    body = _json(reply.content) if parsed is _UNPARSED else parsed
    body = body if isinstance(body, dict) else {}
    envelope = spec.of(surface).envelope
    body_code = body.get(envelope.code)
    if not isinstance(body_code, int) or isinstance(body_code, bool):
        body_code = None
    if isinstance(envelope, MessageEnvelope):
        if reply.status >= 400:
            status = reply.status
        elif body_code is not None and body_code != 200 and 100 <= body_code <= 599:
            status = body_code
        else:
            return None
        msg = body.get(envelope.message)
        match = _REASON_AT_START[surface].match(msg) if isinstance(msg, str) else None
        return _api_error(
            surface,
            status,
            match.group(1) if match else None,
            safe_message(msg, secrets),
            reply,
            now,
        )
    error = body.get(envelope.error)
    error = error if isinstance(error, dict) else None
    if reply.status >= 400:
        status = reply.status
    elif error is not None and envelope.data not in body:
        # An error object on HTTP 2xx: trust the body code if it is an error status.
        status = body_code if body_code is not None and body_code >= 400 else 500
    else:
        return None
    code = error.get(envelope.error_code) if error else None
    return _api_error(
        surface,
        status,
        safe_message(code, secrets) if isinstance(code, str) else None,
        safe_message(error.get(envelope.error_message), secrets) if error else None,
        reply,
        now,
    )


def no_submit_route(surface: Surface, url: str, err: APIError) -> ConfigurationError:
    """A submit answered 404: a submit names no task, so only its route can be missing, and
    that is the base URL's fault (one with a path, say). Nothing was created; no retry, and no
    other request, can mend it."""
    # A submit names no task: a 404 that names no other reason is a missing route.
    code = err.code if err.code not in (None, reasons.TASK_NOT_FOUND.code) else None
    code = code or reasons.NOT_FOUND.code
    return ConfigurationError(
        f"no submit route at {url} (HTTP 404 {code}): the base URL is wrong; it is the "
        "gateway's root, the part before /alpha or /beta",
        status_code=404,
        code=code,
        surface=surface,
    )


def malformed(surface: Surface, status: int, what: str, *, host: str | None = None) -> ServerError:
    """The error of a reply that could not be understood (retried like a 5xx); ``host`` is
    the result host that sent it (``scheme://host:port``), None for the gateway.
    """
    return ServerError(
        f"{_sender(host)} sent a response that could not be understood ({what})",
        status_code=status,
        code=MALFORMED,
        surface=surface,
    )


def transport_error(
    surface: Surface, failure: TransportFailure, *, host: str | None = None
) -> APIConnectionError | ClientClosedError | ServerError:
    """The error a failed exchange means: closed client, oversized reply, timeout, or no
    connection. ``host`` is the result host the exchange was with (``scheme://host:port``,
    see :func:`~.text.link_origin`), None for the gateway: a result link is often served by
    another host, and a user told "the gateway" looks in the wrong place.
    """
    if isinstance(failure.error, ClientClosed):
        return ClientClosedError("the client was closed; make a new one", request_sent=failure.sent)
    if isinstance(failure.error, ReplyTooLarge):
        reply = "the gateway's reply" if host is None else f"the reply of {_sender(host)}"
        return ServerError(
            f"{reply} was larger than {failure.error.limit} bytes; reading stopped",
            code=RESPONSE_TOO_LARGE,
            surface=surface,
        )
    kind = type(failure.error).__name__
    if failure.timeout:
        return APITimeoutError(
            f"the request to {_sender(host)} timed out ({kind})",
            request_sent=failure.sent,
            surface=surface,
        )
    return APIConnectionError(
        f"could not talk to {_sender(host)} ({kind})", request_sent=failure.sent, surface=surface
    )


def _sender(host: str | None) -> str:
    """Who an exchange was with, in words: the gateway, or the result host at ``host``."""
    return "the gateway" if host is None else f"the result host {host}"


def _checked_reply(
    surface: Surface, outcome: Reply | TransportFailure, now: float, secrets: tuple[str, ...]
) -> tuple[Reply, dict[str, Any]]:
    """The reply and its ``data``-bearing body, or raises the error it means."""
    if isinstance(outcome, TransportFailure):
        raise transport_error(surface, outcome) from outcome.error
    if 300 <= outcome.status < 400:  # never followed: a paid request goes where it was aimed
        where = blank(link_for_display(outcome.headers.get("location", "")), secrets)
        raise malformed(
            surface,
            outcome.status,
            f"a redirect to {printable(where, 120)!r}, never followed: check base_url",
        )
    body = _json(outcome.content)
    error = read_error(surface, outcome, now, secrets, body)
    if error is not None:
        raise error
    if not isinstance(body, dict):
        raise malformed(surface, outcome.status, "body is not a JSON object")
    return outcome, body


def _task_id(value: object) -> str | None:
    return value if isinstance(value, str) and not rules.check_task_id(value) else None


def read_submit(
    surface: Surface,
    outcome: Reply | TransportFailure,
    idempotency_key: str,
    now: float,
    secrets: tuple[str, ...] = (),
    *,
    resolution: str | None = None,
    request: ImageRequest | None = None,
) -> Submission:
    """The submission a submit's answer names, or raises the error the answer means. ``now``
    (epoch seconds) is when the answer came: the task's start, unless it was replayed.
    ``request`` is the one sent, which the submission carries.
    """
    reply, body = _checked_reply(surface, outcome, now, secrets)
    wire = spec.of(surface)
    data = body.get(wire.envelope.data)
    answer = wire.submit_answer
    if answer.in_list:
        data = data[0] if isinstance(data, list) and len(data) == 1 else None
    task_id = _task_id(data.get(answer.task_id)) if isinstance(data, dict) else None
    if task_id is None:
        raise malformed(surface, reply.status, "no valid task id")
    replayed = reply.headers.get(spec.REPLAYED_HEADER.lower(), "").strip().lower() == "true"
    return Submission(
        task_id=task_id,
        idempotency_key=idempotency_key,
        surface=surface,
        replayed=replayed,
        resolution=resolution,
        submitted_at=None if replayed else datetime.fromtimestamp(now, timezone.utc),
        request=request,
    )


def poll_hint(outcome: Reply | TransportFailure, now: float) -> float | None:
    """The seconds a query's answer asks before the next one (its ``Retry-After``), or None.
    On an answer that saw its task active it is a hint for the next poll, never an order: the
    schedule heeds it only as far as its promise allows (``poll.with_hint``).
    """
    if not isinstance(outcome, Reply):
        return None
    return parse_retry_after(outcome.headers.get(spec.RETRY_AFTER_HEADER.lower()), now)


def read_task(
    surface: Surface,
    outcome: Reply | TransportFailure,
    task_id: str,
    now: float,
    secrets: tuple[str, ...] = (),
) -> Task:
    """The task a query's answer describes, decoded leniently, or raises the error the answer
    means.
    """
    reply, body = _checked_reply(surface, outcome, now, secrets)
    wire = spec.of(surface)
    data = body.get(wire.envelope.data)
    if not isinstance(data, dict):
        raise malformed(surface, reply.status, "no task record")
    fields = wire.record
    seen_id = data.get(fields.id)
    if seen_id is not None and str(seen_id) != task_id:
        raise malformed(surface, reply.status, "the record is for another task")
    state = data.get(fields.state)
    result = data.get(fields.result)
    if fields.result_as_text and isinstance(result, (str, bytes)):
        result = _json(result)
    cost = charge(data.get(fields.cost)) if fields.cost is not None else None
    credits = charge(data.get(fields.credits))
    fail_code, fail_message = _failure(data, wire)
    urls = result_urls(result, secrets)
    status = task_status(surface, state, secrets)
    task_error = None
    if status is TaskStatus.FAILED:
        task_error = _task_error(state, fail_code, fail_message, secrets)
    task = Task(
        id=task_id,
        surface=surface,
        status=status,
        progress=progress(data.get(fields.progress)),
        image_urls=urls,
        cost=cost,
        credits=credits,
        error=task_error,
        expires_at=expiry.earliest(expiry.stated(result), urls) if urls else None,
        raw=body,
    )
    if urls:  # a gateway may put the key in a link: its repr blanks it for good
        blank_when_shown(task, urls, secrets)
    return task


def _failure(data: Mapping[str, Any], wire: SurfaceSpec) -> tuple[object, object]:
    """A record's failure code and message: in its error object, or fields of its own."""
    fields = wire.record
    holder: object = data if fields.error is None else data.get(fields.error)
    holder = holder if isinstance(holder, dict) else {}
    return holder.get(fields.fail_code), holder.get(fields.fail_message)


def task_status(surface: Surface, state: object, secrets: tuple[str, ...] = ()) -> TaskStatus:
    """The normalised status of a raw state. Unknown states count as running (logged once)."""
    if isinstance(state, str):
        known = STATES[surface].get(state) or STATES[surface].get(state.lower())
        if known is not None:
            return known
    shown = printable(blank(state if isinstance(state, str) else repr(state), secrets), 40)
    label = f"{surface}:{shown}"
    if label not in _unknown_states_logged and len(_unknown_states_logged) < 100:
        _unknown_states_logged.add(label)
        log.warning("unknown task state %r on surface %s; treating it as active", shown, surface)
    return TaskStatus.RUNNING


def _task_error(
    state: object, code: object, message: object, secrets: tuple[str, ...]
) -> TaskError:
    code_text = safe_message(code if not isinstance(code, (int, float)) else str(code), secrets)
    message_text = safe_message(message, secrets)
    if code_text is None and message_text is None:
        cancelled = isinstance(state, str) and state.lower() in spec.CANCELLED_STATES
        return CANCELLED_ERROR if cancelled else UNEXPLAINED_FAILURE
    return TaskError(
        code=code_text or UNEXPLAINED_FAILURE.code,
        message=message_text or UNEXPLAINED_FAILURE.message,
    )


def progress(value: object) -> int | None:
    """An integer percentage 0..100, from an int, float or numeric string; else None."""
    n = number(value)
    return None if n is None else max(0, min(100, int(n)))


def number(value: object) -> float | None:
    """A finite number from a number or numeric text; anything else (a 400-digit integer too)
    is unknown: None, never an error."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        n = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        return None
    return n if math.isfinite(n) else None


def charge(value: object) -> float | None:
    """A charge as a gateway states it (credits or cost): a finite number >= 0. A negative one
    is 0 (a task never pays the account back through its record); NaN, infinity or anything
    not a number is no charge stated (None). A spend cap is kept by these numbers, so none of
    them may lower what a run has spent or make a cap unbounded.
    """
    n = number(value)
    return None if n is None else max(0.0, n)


def result_urls(value: object, secrets: tuple[str, ...] = ()) -> list[str]:
    """Result URLs from a lenient reading of a record's result object (A's arrives as a JSON
    string): ``resultUrls``, ``urls``, ``images[].url`` (a string or a list of strings). Only
    http(s) URLs without spaces or control characters count; repeats count once; past
    :data:`MAX_RESULT_URLS` the rest are left out. What is left out is said once, escaped.

    A link is the user's own paid result, so one is never dropped because the key's
    characters happen to occur in it (a one-letter key occurs in most links). A link that
    carries the whole key as a credential (a path segment or a query value, see
    :func:`carries_secret`) is kept too, so the result stays reachable, and said plainly; it
    is never shown (:func:`redact_url`)."""
    if value is None:  # a record with no result yet: every poll of a running task
        return []
    if isinstance(value, (str, bytes)):
        value = _json(value)
    if not isinstance(value, Mapping):
        return []
    found: list[Any] = []
    for key in spec.RESULT_URL_KEYS:
        found.extend(_as_list(value.get(key)))
    for image in _as_list(value.get(spec.RESULT_IMAGES)):
        if isinstance(image, Mapping):
            found.extend(_as_list(image.get(spec.IMAGE_URL)))
        else:
            found.append(image)
    urls: dict[str, None] = {}  # ordered, and a repeat costs O(1)
    unusable: list[str] = []
    for url in found:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            continue
        if _usable_url(url):
            urls[url] = None
            if len(urls) > MAX_RESULT_URLS:
                break
        else:
            unusable.append(url)
    if unusable:  # control characters or spaces: no URL anyone should fetch
        shown = printable(blank(redact_url(link_for_display(unusable[0]), secrets), secrets), 120)
        log.warning("%d result URL(s) not usable, left out (the first: %s)", len(unusable), shown)
    if len(urls) > MAX_RESULT_URLS:
        log.warning(
            "a task record lists over %d result URLs; using the first %d",
            MAX_RESULT_URLS,
            MAX_RESULT_URLS,
        )
    kept = list(urls)[:MAX_RESULT_URLS]
    hosts = sorted({_host(url) for url in kept if carries_secret(url, secrets)})
    hosts = [h for h in hosts if h not in _key_hosts_told]
    if hosts and len(_key_hosts_told) < 100:  # said once per host: a batch has many such links
        _key_hosts_told.update(hosts)
        log.warning(
            "the gateway put the API key itself in a result link (to %s); the link is kept, "
            "so the paid result can still be downloaded, but downloading it hands the key to "
            "that host, and the link is never shown",
            ", ".join(printable(blank(h, secrets), 80) for h in hosts),
        )
    return kept


def _usable_url(url: str) -> bool:
    return len(url) <= MAX_URL_CHARS and url.isprintable() and not any(c.isspace() for c in url)


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc.rpartition("@")[2] or "?"


def _parts(url: str) -> tuple[list[str], list[str]]:
    """The decoded path segments and query values of a URL."""
    split = urllib.parse.urlsplit(url)
    segments = [urllib.parse.unquote(part) for part in split.path.split("/")]
    values = [v for _, v in urllib.parse.parse_qsl(split.query, keep_blank_values=True)]
    return segments, values


def carries_secret(url: str, secrets: tuple[str, ...]) -> bool:
    """Whether a URL carries a secret as a credential: a whole path segment or a whole query
    value equal to it, or (a secret of 8 characters or more, which does not occur by chance)
    anywhere in it.
    """
    secrets = tuple(s for s in secrets if s)
    if not secrets:
        return False
    if any(len(s) >= 8 and s in url for s in secrets):
        return True
    segments, values = _parts(url)
    return any(part in secrets for part in (*segments, *values))


def redact_url(url: str, secrets: tuple[str, ...]) -> str:
    """``url`` fit to print: every path segment or query value equal to a secret, and every
    occurrence of a secret of 8 characters or more, replaced by ``[redacted]``. A link whose
    characters merely include a short key's is printed as it is.

    Example::

        redact_url("https://cdn.example/r/1.png?key=e", ("e",))
        # 'https://cdn.example/r/1.png?key=[redacted]'
    """
    secrets = tuple(s for s in secrets if s)
    if not secrets or not carries_secret(url, secrets):
        return url
    for secret in secrets:
        if len(secret) >= 8:
            url = url.replace(secret, REDACTED)
    split = urllib.parse.urlsplit(url)
    path = "/".join(
        REDACTED if urllib.parse.unquote(part) in secrets else part
        for part in split.path.split("/")
    )
    query = "&".join(_redact_pair(pair, secrets) for pair in split.query.split("&"))
    return urllib.parse.urlunsplit(split._replace(path=path, query=query if split.query else ""))


def _redact_pair(pair: str, secrets: tuple[str, ...]) -> str:
    name, equals, value = pair.partition("=")
    if equals and urllib.parse.unquote_plus(value) in secrets:
        return f"{name}={REDACTED}"
    return pair


def _as_list(value: object) -> list[Any]:
    if isinstance(value, list):
        return value
    return [] if value is None else [value]
