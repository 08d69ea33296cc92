"""The reference gateway's pure core: ``MockGateway.handle(MockRequest) -> MockResponse``.

No sockets and no sleeping: time comes from an injected clock and every random choice from one
seeded generator, so a run is repeatable. Faults are part of the answer (``delay``, ``drop``,
``truncate``) and the adapters carry them out on the wire.

Error answers (bodies per SPEC 7) are the rows of the reason table in
``imggw_client._core.reasons``: its status, code and message, with a message naming the field
and the rule where there is one. Result links answer in plain text instead: 403 for a link past
its ``Expires``, unsigned, or whose signature does not match; 404 for one that never existed;
410 for a result past its retention window.

Tasks are per surface: a task created on one surface is not found on the other. Idempotency
keys belong to the API key, not to a surface: a key is bound to its first request (surface and
body), so the same key on the other surface is a conflict (422), even for the same prompt,
because it is another wire request.

Request limits (``submit_limit="N/S"``, ``query_limit="N/S"``): at most N requests of that kind
per API key in any S seconds (a sliding window), both surfaces counted together. The excess
gets 429 ``rate_limited`` with ``Retry-After`` (whole seconds until a slot frees; none under
the ``no_retry_after`` quirk; HTTP 200 with code 429 on surface A under ``alpha_http200``),
changes nothing and is counted in ``/_mock/stats`` as ``rate_limited``.

Result links are signed, as an object store's are:
``<origin>/results/<token>.png?Expires=<Unix seconds>&Signature=<hex>``. Each query of a
succeeded task hands out a link valid for ``link_ttl`` seconds (never past the retention;
default: the retention), while the file is kept for ``retention`` seconds after completion;
surface B's image objects carry the same ``expires_at``. Unix time is the clock mapped once to
the wall clock, so ``/_mock/advance`` moves link expiry too.

Memory is bounded by the live window: a task (and its link) is forgotten a minute after its
retention ends (then 404), an idempotency key after ``idempotency_ttl``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import math
import os
import random
import re
import threading
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .._core import reasons, rules, spec
from .._core.exceptions import ConfigurationError
from .._core.models import ImageRequest, TaskError, TaskStatus
from .._core.spec import Surface
from . import _serving as serving
from ._config import MockConfig, parse_limit
from ._messages import IN_PROCESS_URL, JSON_CONTENT, MockRequest, MockResponse
from ._openapi import openapi_document
from ._png import png, size_for
from ._serving import Refusal, TaskView, refuse

if TYPE_CHECKING:
    from .._async_client import AsyncClient
    from .._base_client import BaseClient
    from .._client import Client
    from ._asgi import ASGIApp
    from ._transport import MockTransport

    C = TypeVar("C", bound=BaseClient[Any])

__all__ = ["IN_PROCESS_URL", "ManualClock", "MockGateway", "MockRequest", "MockResponse"]

RESULTS_PREFIX = spec.RESULTS_PREFIX
QUEUE_SHARE = 0.2  # the first fifth of a task's duration is spent pending
# Past its retention a task still answers (its links 410) for this long, then it is forgotten.
FORGET_MARGIN = 60.0
# Stats name the standard methods; any other is counted as OTHER, so a client inventing
# methods cannot grow the stats without bound.
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)
_LINK_QUERY = re.compile(r"[0-9]{1,20}")
FAIL_TAG = re.compile(r"#fail(?::([a-z0-9_]{1,64}))?")
PUBLIC_FAILURES = {
    "content_policy_violation": "The prompt was refused by the content policy.",
    "generation_failed": "The image could not be generated.",
    "upstream_timeout": "The generation took too long and was stopped.",
}
# The injected server faults, by the fault kind that names their status.
_SERVER_FAULTS = {
    str(reason.status): refuse(reason)
    for reason in (
        reasons.INTERNAL_ERROR,
        reasons.BAD_GATEWAY,
        reasons.SERVICE_UNAVAILABLE,
        reasons.GATEWAY_TIMEOUT,
    )
}
_JSON = JSON_CONTENT
_RETRY_AFTER = spec.RETRY_AFTER_HEADER.lower()
_TEXT = ("content-type", "text/plain; charset=utf-8")


class ManualClock:
    """A clock that moves only when told: ``advance(seconds)``.

    Example::

        clock = ManualClock()
        gateway = MockGateway(clock=clock)
        clock.advance(30)
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError("seconds must be a finite number >= 0")
        self.now += seconds


@dataclass
class _Task:
    id: str
    surface: Surface
    owner: str
    request: ImageRequest
    created: float
    duration: float
    failure: TaskError | None
    token: str
    credits: float
    cost: float

    @property
    def finished(self) -> float:
        return self.created + self.duration


@dataclass
class _KeyBinding:
    """An idempotency key bound to its first request."""

    digest: bytes  # of the surface and canonical body (serving.request_digest)
    task_id: str
    created: float
    ready: float  # before this, the first request is still in flight


@dataclass
class _Stats:
    tasks_created: int = 0
    replays: int = 0
    conflicts: int = 0
    rate_limited: int = 0
    billing: dict[str, dict[str, float]] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)


def fingerprint(api_key: str) -> str:
    """How stats name a key: never the key itself."""
    return "key_" + hashlib.sha256(api_key.encode()).hexdigest()[:12]


def _credits(request: ImageRequest) -> float:
    return {"1k": 4.0, "2k": 8.0, "4k": 16.0}.get(request.resolution.lower(), 4.0)


class MockGateway:
    """A faithful, stateful imggw gateway for tests, demos and benchmarks.

    Keywords are the fields of :class:`MockConfig` (``api_keys``, ``seed``, ``duration_min``,
    ``duration_max``, ``failure_rate``, ``fault_rate``, ``faults``, ``quirks``, ``retention``,
    ``link_ttl``, ``submit_limit``, ``query_limit``, ``manual_clock``, ...); ``clock`` injects
    a time source (monotonic seconds).

    Example::

        gateway = MockGateway(api_keys=["test-key"], seed=0, duration_min=0.1, duration_max=0.5)
        with gateway.client() as client:                  # in-process, no sockets
            task = client.generate("a lighthouse")
        with gateway.serve() as base_url:                 # uvicorn on 127.0.0.1
            ...
        MockGateway(submit_limit="20/10", query_limit="10/1")   # the provider's own limits
    """

    def __init__(
        self,
        api_keys: list[str] | tuple[str, ...] | None = None,
        seed: int = 0,
        *,
        clock: Callable[[], float] | None = None,
        **settings: Any,
    ) -> None:
        if api_keys is not None:
            settings["api_keys"] = tuple(api_keys)
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], deque[float]] = {}
        self._apply(MockConfig(seed=seed, **settings))
        if clock is None:
            clock = ManualClock() if self.config.manual_clock else time.monotonic
        self.clock = clock
        # Links carry Unix seconds: the clock mapped to the wall clock once, so that a manual
        # clock (and /_mock/advance) moves link expiry as it moves everything else.
        self._epoch = time.time() - clock()
        self._token_secret = os.urandom(16)
        self._link_secret = os.urandom(32)
        self._openapi = json.dumps(openapi_document()).encode()
        self.reset()

    # ------------------------------------------------------------------------ adapters

    def transport(self) -> MockTransport:
        """An httpx transport (sync and async) that routes requests here, with no sockets.

        Example::

            client = Client(api_key="test-key", base_url=IN_PROCESS_URL,
                            http_client=httpx.Client(transport=gateway.transport()))
        """
        from ._transport import MockTransport

        return MockTransport(self)

    def asgi(self) -> ASGIApp:
        """The gateway as an ASGI app, for any ASGI server."""
        from ._asgi import ASGIApp

        return ASGIApp(self)

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> AbstractContextManager[str]:
        """Serves over a real socket (uvicorn, background thread); yields the base URL.

        Example::

            with gateway.serve() as base_url:
                client = Client(api_key="test-key", base_url=base_url)
        """
        from ._asgi import serve

        return serve(self, host, port)

    def client(self, **kwargs: Any) -> Client:
        """A :class:`Client` wired to this gateway in-process (the first API key)."""
        from .._client import Client

        return self._wire(Client, kwargs)

    def async_client(self, **kwargs: Any) -> AsyncClient:
        """An :class:`AsyncClient` wired to this gateway in-process (the first API key)."""
        from .._async_client import AsyncClient

        return self._wire(AsyncClient, kwargs)

    def _wire(self, cls: type[C], kwargs: dict[str, Any]) -> C:
        kwargs.setdefault("api_key", self.config.api_keys[0])
        kwargs.setdefault("base_url", IN_PROCESS_URL)
        # Over a transport, the client makes its own HTTP client, so owns it (closed with the
        # client) and makes another under a new event loop; the transport holds no connections.
        return cls(transport=self.transport(), **kwargs)

    # ------------------------------------------------------------------------ control

    def configure(self, **changes: Any) -> None:
        """Changes settings on the fly (faults, quirks, rates, limits, ...); tasks and keys stay.

        ``credits=N`` gives every key a balance of N from now on (a top-up, or None: no limit).

        Example::

            gateway.configure(fault_rate=0.0)   # the rest of this test runs without faults
        """
        if "manual_clock" in changes:
            raise ConfigurationError("manual_clock is fixed when the gateway is made")
        with self._lock:
            self._apply(dataclasses.replace(self.config, **changes))
            if "credits" in changes:
                self._fill_balances()

    def _fill_balances(self) -> None:
        credits = self.config.credits
        self._balances = {} if credits is None else {fp: credits for _, fp in self._keys}

    def _apply(self, config: MockConfig) -> None:
        self.config = config
        self._keys = [(k.encode(), fingerprint(k)) for k in config.api_keys]
        self._quirks = frozenset(config.quirks)
        self._limits: dict[str, tuple[int, float] | None] = {
            spec.SUBMIT: parse_limit(config.submit_limit),
            spec.QUERY: parse_limit(config.query_limit),
        }
        for (owner, kind), window in self._windows.items():
            limit = self._limits[kind]
            if limit is not None and window.maxlen != limit[0]:  # keeps the newest N
                self._windows[(owner, kind)] = deque(window, maxlen=limit[0])

    def reset(self) -> None:
        """Forgets every task, key, window and counter; the random generator starts over."""
        with self._lock:
            self._rng = random.Random(self.config.seed)
            self._tasks: dict[tuple[Surface, str], _Task] = {}
            self._tokens: dict[str, _Task] = {}
            self._bindings: dict[tuple[str, str], _KeyBinding] = {}
            # Creation order, for purging the oldest first in O(1) each.
            self._task_queue: deque[_Task] = deque()
            self._binding_queue: deque[tuple[tuple[str, str], _KeyBinding]] = deque()
            self._windows.clear()
            self._stats = _Stats()
            self._next_id = self.config.first_task_id
            self._fill_balances()

    def advance(self, seconds: float) -> None:
        """Moves a manual clock forward (``manual_clock=True``)."""
        if not isinstance(self.clock, ManualClock):
            raise RuntimeError("advance() needs manual_clock=True")
        self.clock.advance(seconds)

    def stats(self) -> dict[str, Any]:
        """What ``GET /_mock/stats`` returns: created tasks (each billed once), replays,
        conflicts, requests refused by a limit (``rate_limited``), billing per key
        fingerprint, requests per route, faults per kind, what is held in memory (``live``:
        tasks and idempotency keys not yet forgotten), and with ``credits``, each key's
        remaining balance (``balances``, by key fingerprint; empty without).

        Example::

            assert gateway.stats()["tasks_created"] == 1
        """
        with self._lock:
            self._purge(self.clock())
            s = self._stats
            return {
                "tasks_created": s.tasks_created,
                "replays": s.replays,
                "conflicts": s.conflicts,
                "rate_limited": s.rate_limited,
                "billing": {fp: dict(b) for fp, b in s.billing.items()},
                "requests": dict(s.requests),
                "faults": dict(s.faults),
                "live": {"tasks": len(self._tasks), "idempotency_keys": len(self._bindings)},
                "balances": dict(self._balances),
                "clock": self.clock(),
            }

    # ------------------------------------------------------------------------ the core

    def handle(self, request: MockRequest) -> MockResponse:
        """Answers one request. Thread-safe."""
        if "?" in request.path:  # a path with its query, as a result link names it
            path, _, query = request.path.partition("?")
            params = {**dict(urllib.parse.parse_qsl(query)), **request.query}
            request = dataclasses.replace(request, path=path, query=params)
        if request.path.startswith(spec.CONTROL_PREFIX) or request.path == spec.OPENAPI_PATH:
            return self._control(request)  # never faulted; takes the lock where it needs it
        with self._lock:
            return self._handle(request)

    def _handle(self, req: MockRequest) -> MockResponse:
        now = self.clock()
        self._purge(now)
        surface = serving.surface_of(req.path)
        route, handler, kind = self._route(req)
        self._stats.requests[route] += 1
        fault = self._draw_fault()
        delay = 0.0
        if fault is not None:
            self._stats.faults[fault] += 1
            early = self._early_fault(fault, surface)
            if early is not None:
                return early
            if fault == "latency":
                delay = self._rng.uniform(0, self.config.latency)
        if handler is None:
            response = self._error(surface, refuse(reasons.NOT_FOUND))
        elif not kind:  # public: result links (the link is the credential) and wrong methods
            response = handler(req, surface)
        else:
            owner = self._authenticate(req)
            if owner is None:
                response = self._error(surface, refuse(reasons.UNAUTHORIZED))
            else:
                wait = self._admit(owner, kind, now)
                if wait is not None:
                    response = self._rate_limited(surface, kind, wait)
                else:
                    response = handler(req, surface, owner, delay)
        return self._late_fault(fault, response, delay, result=handler == self._result)

    def _route(self, req: MockRequest) -> tuple[str, Callable[..., MockResponse] | None, str]:
        """The route's name (for stats), its handler (None for no route) and its kind:
        ``submit`` or ``query`` (authenticated, counted against a limit), or empty for the
        public answers (result links, and 405 for a wrong method on any route)."""
        method = req.method if req.method in _METHODS else "OTHER"
        endpoint = serving.match_route(req.path)
        handler: Callable[..., MockResponse]
        kind = ""
        if endpoint is not None:
            template, allowed, kind = endpoint.template, endpoint.method, endpoint.operation
            handler = self._submit if endpoint.operation == spec.SUBMIT else self._query
        elif req.path.startswith(RESULTS_PREFIX):
            template, allowed, handler = RESULTS_PREFIX + "{token}", "GET", self._result
        else:
            return f"{method} (unknown)", None, ""
        if req.method != allowed:
            return f"{method} {template}", self._not_allowed(allowed), ""
        return f"{method} {template}", handler, kind

    def _not_allowed(self, allowed: str) -> Callable[..., MockResponse]:
        def answer(req: MockRequest, surface: Surface, *_: object) -> MockResponse:
            response = self._error(surface, refuse(reasons.METHOD_NOT_ALLOWED, f"Use {allowed}."))
            return MockResponse(
                response.status, response.body, (*response.headers, ("allow", allowed))
            )

        return answer

    def _authenticate(self, req: MockRequest) -> str | None:
        token = serving.bearer_token(req.headers)
        if token is None:
            return None
        given = token.encode()
        owner = None
        for key, fp in self._keys:  # compare with every key, in constant time each
            if hmac.compare_digest(given, key):
                owner = fp
        return owner

    # ------------------------------------------------------------------------ limits

    def _admit(self, owner: str, kind: str, now: float) -> float | None:
        """Counts a request against its key's sliding window: None when admitted, else the
        seconds until a slot frees. A refused request is not counted."""
        limit = self._limits[kind]
        if limit is None:
            return None
        count, seconds = limit
        window = self._windows.get((owner, kind))
        if window is None:
            window = self._windows[(owner, kind)] = deque(maxlen=count)
        while window and window[0] <= now - seconds:  # admitted in (now - S, now] still count
            window.popleft()
        if len(window) < count:
            window.append(now)
            return None
        return window[0] + seconds - now

    def _rate_limited(self, surface: Surface, kind: str, wait: float) -> MockResponse:
        self._stats.rate_limited += 1
        limit = self._limits[kind]
        assert limit is not None
        count, seconds = limit
        message = f"Too many {kind} requests for this API key: at most {count} in {seconds:g} s."
        return self._too_many(surface, message, max(1, math.ceil(wait)))

    def _too_many(self, surface: Surface, message: str | None, retry_after: int) -> MockResponse:
        response = self._error(surface, refuse(reasons.RATE_LIMITED, message))
        if "no_retry_after" in self._quirks:
            return response
        retry = (_RETRY_AFTER, str(retry_after))
        return MockResponse(response.status, response.body, (*response.headers, retry))

    # ------------------------------------------------------------------------ faults

    def _draw_fault(self) -> str | None:
        if self.config.fault_rate and self._rng.random() < self.config.fault_rate:
            return self._rng.choice(self.config.faults)
        return None

    def _early_fault(self, fault: str, surface: Surface) -> MockResponse | None:
        """Faults that stop a request before it is processed."""
        if fault == "reset":
            return MockResponse(0, drop=True)
        if fault == "429":
            return self._too_many(surface, None, self.config.retry_after)
        if fault in _SERVER_FAULTS:
            return self._error(surface, _SERVER_FAULTS[fault])
        return None

    def _late_fault(
        self, fault: str | None, response: MockResponse, delay: float, *, result: bool
    ) -> MockResponse:
        """Faults that strike after the request was processed."""
        if fault == "lost":
            return MockResponse(0, drop=True)
        if fault == "malformed":
            if result:  # an image cut short of its Content-Length
                return MockResponse(response.status, response.body, response.headers, truncate=True)
            return MockResponse(response.status, response.body[: len(response.body) // 2])
        if delay:
            return MockResponse(response.status, response.body, response.headers, delay=delay)
        return response

    # ------------------------------------------------------------------------ routes

    def _submit(self, req: MockRequest, surface: Surface, owner: str, delay: float) -> MockResponse:
        key = req.headers.get(spec.IDEMPOTENCY_HEADER.lower())
        if key is not None and rules.check_idempotency_key(key):
            violation = rules.check_idempotency_key(key)[0]
            message = f"{spec.IDEMPOTENCY_HEADER}: {violation.rule}"
            return self._error(surface, refuse(reasons.BY_CODE[violation.code], message))
        parsed = serving.read_submit_request(surface, req.body)
        if isinstance(parsed, Refusal):
            return self._error(surface, parsed)
        now = self.clock()
        digest = serving.request_digest(surface, req.body)
        # Expired keys were purged: a binding found here is live.
        binding = self._bindings.get((owner, key)) if key is not None else None
        if binding is not None:
            if not hmac.compare_digest(binding.digest, digest):
                self._stats.conflicts += 1
                return self._error(surface, refuse(reasons.IDEMPOTENCY_KEY_REUSED))
            if now < binding.ready:
                self._stats.conflicts += 1
                response = self._error(surface, refuse(reasons.IDEMPOTENCY_IN_PROGRESS))
                retry = (_RETRY_AFTER, str(max(1, math.ceil(binding.ready - now))))
                return MockResponse(response.status, response.body, (*response.headers, retry))
            self._stats.replays += 1
            body = serving.submit_response(surface, binding.task_id)
            return MockResponse(200, body, (_JSON, (spec.REPLAYED_HEADER.lower(), "true")))
        balance = self._balances.get(owner)
        if balance is not None and balance < _credits(parsed):  # a replay above costs nothing
            return self._error(surface, refuse(reasons.INSUFFICIENT_CREDITS))
        task = self._create(surface, owner, parsed, now)
        if key is not None:
            # Under a latency fault the key stays in flight until its answer is due.
            binding = _KeyBinding(digest, task.id, now, now + delay)
            self._bindings[(owner, key)] = binding
            self._binding_queue.append(((owner, key), binding))
        return MockResponse(200, serving.submit_response(surface, task.id))

    def _create(self, surface: Surface, owner: str, request: ImageRequest, now: float) -> _Task:
        task_id = str(self._next_id)
        self._next_id += 1
        config = self.config
        duration = self._rng.uniform(config.duration_min, config.duration_max)
        failure = None
        tag = FAIL_TAG.search(request.prompt)
        if tag is not None:
            code = tag.group(1) or "generation_failed"
            failure = TaskError(
                code=code, message=PUBLIC_FAILURES.get(code, "The generation failed.")
            )
        elif config.failure_rate and self._rng.random() < config.failure_rate:
            code = self._rng.choice(sorted(PUBLIC_FAILURES))
            failure = TaskError(code=code, message=PUBLIC_FAILURES[code])
        credits = _credits(request)
        token = hmac.new(self._token_secret, f"{surface}/{task_id}".encode(), "sha256").hexdigest()
        task = _Task(
            task_id,
            surface,
            owner,
            request,
            now,
            duration,
            failure,
            token[:32],
            credits,
            credits * 0.0025,
        )
        self._tasks[(surface, task_id)] = task
        self._tokens[task.token] = task
        self._task_queue.append(task)
        self._stats.tasks_created += 1
        bill = self._stats.billing.setdefault(owner, {"tasks": 0, "credits": 0.0, "cost": 0.0})
        bill["tasks"] += 1
        bill["credits"] += task.credits
        bill["cost"] = round(bill["cost"] + task.cost, 6)
        if owner in self._balances:
            self._balances[owner] -= task.credits
        return task

    def _purge(self, now: float) -> None:
        """Forgets tasks a minute past their retention and keys past ``idempotency_ttl``.
        Both were created in time order, so the oldest go first, each in O(1); a task that
        finished early waits behind older ones at most the spread of durations."""
        tasks, forget = self._task_queue, self.config.retention + FORGET_MARGIN
        while tasks and now > tasks[0].finished + forget:
            task = tasks.popleft()
            del self._tasks[(task.surface, task.id)]
            del self._tokens[task.token]
        bindings, ttl = self._binding_queue, self.config.idempotency_ttl
        while bindings and now - bindings[0][1].created > ttl:
            key, binding = bindings.popleft()
            if self._bindings.get(key) is binding:
                del self._bindings[key]

    def _query(self, req: MockRequest, surface: Surface, owner: str, _: float) -> MockResponse:
        task_id = serving.query_task_id(surface, req.path, req.query)
        if rules.check_task_id(task_id):
            return self._error(surface, refuse(reasons.INVALID_TASK_ID))
        task = self._tasks.get((surface, task_id))
        if task is None or task.owner != owner:
            return self._error(surface, refuse(reasons.TASK_NOT_FOUND))
        view = self._view(task, req.base_url)
        body = serving.task_record(
            surface,
            view,
            extra_states="extra_states" in self._quirks,
            omit_progress="no_progress" in self._quirks,
            omit_charge="no_charge" in self._quirks,
        )
        return MockResponse(200, body)

    def _view(self, task: _Task, base_url: str) -> TaskView:
        now = self.clock()
        elapsed = now - task.created
        queue = task.duration * QUEUE_SHARE
        urls: tuple[str, ...] = ()
        expires_at = None
        if elapsed >= task.duration:
            status = TaskStatus.FAILED if task.failure else TaskStatus.SUCCEEDED
            progress, late = 100, True
            if task.failure is None:
                url, expires_at = self._link(task, base_url, now)
                urls = (url,)
        elif elapsed < queue:
            status, progress, late = TaskStatus.PENDING, 0, elapsed >= queue / 2
        else:
            status = TaskStatus.RUNNING
            progress = min(99, int(100 * (elapsed - queue) / max(task.duration - queue, 1e-9)))
            late = progress >= 50
        credits, cost = task.credits, task.cost
        if "charge_at_end" in self._quirks and elapsed < task.duration:
            credits, cost = 0.0, 0.0  # billed at submit all the same
        return TaskView(
            task.id,
            status,
            progress,
            urls,
            credits,
            cost,
            task.failure if status is TaskStatus.FAILED else None,
            late,
            expires_at,
        )

    # ------------------------------------------------------------------------ result links

    def _link(self, task: _Task, base_url: str, now: float) -> tuple[str, int]:
        """A fresh signed link to the task's image and its ``Expires`` (Unix seconds): valid
        for ``link_ttl`` from now, never past the retention."""
        config = self.config
        ttl = config.retention if config.link_ttl is None else config.link_ttl
        end = min(now + ttl, task.finished + config.retention)
        expires = math.ceil(end + self._epoch)
        query = urllib.parse.urlencode(
            {spec.LINK_EXPIRES: expires, spec.LINK_SIGNATURE: self._sign(task.token, expires)}
        )
        return f"{base_url}{RESULTS_PREFIX}{task.token}.png?{query}", expires

    def _sign(self, token: str, expires: int | str) -> str:
        message = f"{RESULTS_PREFIX}{token}.png\n{expires}".encode()
        return hmac.new(self._link_secret, message, "sha256").hexdigest()

    def _result(self, req: MockRequest, surface: Surface) -> MockResponse:
        token = req.path[len(RESULTS_PREFIX) :].removesuffix(".png")
        expires = req.query.get(spec.LINK_EXPIRES, "")
        signature = req.query.get(spec.LINK_SIGNATURE, "")
        # As an object store: the signature is checked before anything is looked up.
        signed = _LINK_QUERY.fullmatch(expires) is not None and hmac.compare_digest(
            self._sign(token, expires).encode(), signature.encode("utf-8", "replace")
        )
        if not signed:
            refusal = b"forbidden: the link is unsigned or its signature does not match"
            return MockResponse(403, refusal, (_TEXT,))
        task = self._tokens.get(token)
        now = self.clock()
        if task is None or task.failure is not None or now < task.finished:
            return MockResponse(404, b"not found", (_TEXT,))
        if now > task.finished + self.config.retention:
            return MockResponse(410, b"expired: the result is no longer kept", (_TEXT,))
        if now + self._epoch >= int(expires):
            return MockResponse(403, b"forbidden: the link has expired", (_TEXT,))
        width, height = size_for(task.request.aspect_ratio, self.config.image_size)
        seed = int.from_bytes(bytes.fromhex(task.token[:6]), "big")
        image = png(width, height, seed, min_size=self.config.result_size)
        return MockResponse(200, image, (("content-type", "image/png"),))

    # ------------------------------------------------------------------------ helpers

    def _error(self, surface: Surface, refusal: Refusal) -> MockResponse:
        status, body = serving.error_body(
            surface,
            refusal,
            http_200="alpha_http200" in self._quirks,
            omit_code="beta_no_code" in self._quirks,
        )
        return MockResponse(status, body)

    def _control(self, req: MockRequest) -> MockResponse:
        route = (req.method, req.path)
        if route == ("GET", spec.OPENAPI_PATH):
            return MockResponse(200, self._openapi)
        if route == ("GET", spec.STATS_PATH):
            return MockResponse(200, json.dumps(self.stats()).encode())
        if route == ("POST", spec.RESET_PATH):
            self.reset()
            return MockResponse(200, b'{"reset":true}')
        if route == ("POST", spec.ADVANCE_PATH):
            try:
                self.advance(float(req.query.get("seconds", "")))
            except (ValueError, RuntimeError) as exc:
                # The control API's own code: tests call it, no client of the surfaces does.
                problem = {"error": {"code": "bad_advance", "message": str(exc)}}
                return MockResponse(400, json.dumps(problem).encode())
            return MockResponse(200, json.dumps({"clock": self.clock()}).encode())
        nowhere = reasons.NOT_FOUND
        missing = {"error": {"code": nowhere.code, "message": nowhere.message}}
        return MockResponse(404, json.dumps(missing).encode())
