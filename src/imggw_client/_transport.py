"""The one place that knows httpx: core wire values to httpx requests and back, and the HTTP
client behind a client and its ``with_options`` copies (:class:`Connection`: whose it is, which
process's and which event loop's, and how it is closed).

A caller's own HTTP client may be an ``httpx`` one or an ``httpx2`` one (Pydantic's
continuation of httpx: the same API with its own classes, which openai-python 3 and other SDKs
hand their users). Whatever is asked of a client's classes (its timeouts, its errors) is asked
of the library that made it, found by name, so httpx2 is imported only by those who use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar

import anyio
import httpx

from ._core import surfaces
from ._core.budget import WriteGate
from ._core.config import Settings
from ._core.exceptions import ConfigurationError, DownloadError
from ._core.origins import Origin, refused_redirect
from ._core.text import link_origin
from ._core.wire import Fetch, Reply, ReplyTooLarge, Send, TransportFailure
from ._download import REDIRECT_REFUSED
from ._version import __version__

log = logging.getLogger("imggw_client")

USER_AGENT = f"imggw-python/{__version__}"
HttpClient = httpx.Client | httpx.AsyncClient
H = TypeVar("H", httpx.Client, httpx.AsyncClient)

# The libraries whose clients are taken as ``http_client=``: the same API, each its own classes.
LIBRARIES = ("httpx", "httpx2")
# Headers every client of theirs carries by default (see build_request).
_SET_LATER = frozenset({"accept", "user-agent"})
# An HTTP client's class: whether it builds as its library does (an entry a class a process uses)
_PLAIN: dict[type, bool] = {}
# The User-Agent each of them sends when its caller sets none.
_THEIR_DEFAULT_AGENTS = tuple(f"python-{name}/" for name in LIBRARIES)
# The TLS context of every HTTP client the SDK makes, per certificates named (shared_tls).
_tls: dict[tuple[str, str], ssl.SSLContext] = {}
_tls_lock = threading.Lock()


def library_of(kind: type) -> ModuleType | None:
    """The HTTP library (httpx or httpx2) that defines ``kind`` or one of its bases: a
    caller's subclass of ``httpx2.Client`` is httpx2's. Under ``httpx2.alias_httpx()`` httpx's
    name is httpx2's module, which is what every class then comes from."""
    for cls in kind.__mro__:
        root = cls.__module__.partition(".")[0]
        if root in LIBRARIES:
            return sys.modules[root]
    return None


def require_http_client(http: object, kind: str) -> None:
    """Raises ConfigurationError unless ``http`` is an httpx or httpx2 client of ``kind``
    (``"Client"`` or ``"AsyncClient"``), naming what was given."""
    library = library_of(type(http))
    if library is None or not isinstance(http, getattr(library, kind)):
        given = f"{type(http).__module__}.{type(http).__qualname__}"
        raise ConfigurationError(
            f"http_client must be an httpx.{kind} or an httpx2.{kind}, not {given}"
        )


def shared_tls(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for an HTTP client the SDK makes, with the process's one TLS context for
    the certificates the environment names (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, else
    certifi's), as httpx's own default would be. httpx builds a new one for every client,
    reading and parsing the whole bundle (about 20 ms of CPU): an application making a client
    per request paid that on its event loop each time. Left alone when ``options`` say how to
    verify (``verify``, ``cert``, ``trust_env``) or ask for HTTP/2 (whose connections set the
    context's protocols: never shared with one that speaks HTTP/1.1 alone)."""
    if {"verify", "cert", "trust_env", "http2"} & options.keys():
        return options
    named = (os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))
    with _tls_lock:
        context = _tls.get(named)
        if context is None:
            context = _tls[named] = httpx.create_ssl_context()
    return {**options, "verify": context}


def user_agent(http: HttpClient) -> str:
    """Ours, after the caller's own when their HTTP client sets one (its library's default
    aside): a caller who names their application keeps that name in every request."""
    theirs = http.headers.get("user-agent", "").strip()
    if not theirs or theirs.startswith(_THEIR_DEFAULT_AGENTS):
        return USER_AGENT
    return f"{theirs} {USER_AGENT}"


def build_request(
    http: HttpClient, settings: Settings, send: Send, agent: str = USER_AGENT
) -> httpx.Request:
    wire = send.request
    headers = dict(wire.headers or {})
    # Accept and User-Agent, which every httpx client carries, are set on the built request:
    # merged over the client's own, each is looked up and removed first, a tenth of the
    # instructions a request costs in httpx. The value is the same either way; a client whose
    # class builds requests its own way is handed them as before, to see and change.
    plain = _PLAIN.get(type(http))
    if plain is None:
        plain = _builds_plainly(http)
    later = [("Accept", headers.pop("Accept"))] if plain and "Accept" in headers else []
    if not headers.keys() <= surfaces.OWN_HEADERS:
        for name in [name for name in headers if name.lower() in _SET_LATER]:
            if name.lower() == "user-agent":
                # A caller's own User-Agent (default_headers, extra_headers) names their
                # application, as their httpx client's does: ours follows it.
                if theirs := headers.pop(name).strip():
                    agent = f"{theirs} {USER_AGENT}"
            elif plain:
                later.append((name, headers.pop(name)))
    if plain:
        later.append(("User-Agent", agent))
    else:
        headers["User-Agent"] = agent
    # The key goes on each request, never on the httpx client, so a caller's client is not
    # altered and result downloads (which use the same client) never carry it. Last: nothing
    # a caller adds can replace it.
    headers[surfaces.AUTHORIZATION_HEADER] = surfaces.authorization(settings.api_key)
    extensions: dict[str, Any] = {"timeout": request_timeout(settings, send.timeout)}
    if send.gate is not None:
        extensions["trace"] = _gated(http, send.gate)
    request = http.build_request(
        wire.method,
        settings.base_url + wire.path,
        params=wire.params,
        headers=headers,
        content=wire.body,
        extensions=extensions,
    )
    for name, value in later:
        request.headers[name] = value
    return request


def _builds_plainly(http: HttpClient) -> bool:
    """Whether ``http``'s class builds requests as its library does (no override of
    ``build_request``), remembered in ``_PLAIN``."""
    kind = type(http)
    library = library_of(kind) or httpx
    plain = _PLAIN[kind] = kind.build_request is library.Client.build_request or (
        kind.build_request is library.AsyncClient.build_request
    )
    return plain


def request_timeout(settings: Settings, seconds: float) -> dict[str, float | None]:
    """The timeout of a request that must end within ``seconds``, as httpx's ``timeout``
    extension: those seconds for each phase, or, when the caller gave an ``httpx.Timeout`` (or
    httpx2's), each of its limits within them. What ``Timeout(...).as_dict()`` is, in either
    library, without a Timeout made (and copied by ``build_request``) for every request."""
    given = settings.http_timeout
    if given is None:
        return {"connect": seconds, "read": seconds, "write": seconds, "pool": seconds}
    connect, read, write, pool = (
        seconds if limit is None else min(limit, seconds)
        for limit in (given.connect, given.read, given.write, given.pool)
    )
    return {"connect": connect, "read": read, "write": write, "pool": pool}


# httpcore's trace event right before it writes a request's head (HTTP/1.1 and HTTP/2 alike):
# after any wait for a pooled connection, and followed by the write with no await between.
_HEAD_STARTED = ".send_request_headers.started"


def _gated(http: HttpClient, gate: WriteGate) -> Callable[[str, Any], Awaitable[None] | None]:
    """httpcore's ``trace`` extension for a paced request: its head waits for the budget's
    write gate (``Budget.writing``). A transport that traces nothing (a mock, ASGI) leaves
    the request to its slot alone."""
    library = library_of(type(http)) or httpx
    if isinstance(http, library.AsyncClient):

        async def trace_async(event: str, info: Any) -> None:
            if event.endswith(_HEAD_STARTED):
                while (wait := gate.wait()) > 0:
                    await anyio.sleep(wait)

        return trace_async

    def trace(event: str, info: Any) -> None:
        if event.endswith(_HEAD_STARTED):
            while (wait := gate.wait()) > 0:
                time.sleep(wait)

    return trace


class Body:
    """A reply's body, read chunk by chunk (decoded, so a compressed bomb is caught too), up to
    :data:`surfaces.MAX_REPLY_BYTES`: a hostile reply is never buffered whole."""

    def __init__(self, limit: int = surfaces.MAX_REPLY_BYTES) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise ReplyTooLarge(self.limit)
        self.parts.append(chunk)

    @property
    def content(self) -> bytes:
        return b"".join(self.parts)


def to_reply(response: httpx.Response, content: bytes, elapsed: float) -> Reply:
    if log.isEnabledFor(logging.DEBUG):
        request = response.request
        log.debug(
            "%s %s -> %d (%.0f ms)",
            request.method,
            request.url.path,
            response.status_code,
            elapsed * 1e3,
        )
    return Reply(response.status_code, response.headers, content)


def to_failure(exc: Exception) -> TransportFailure | None:
    """What the core makes of an exception a send raised: a failure that means "no complete
    response" (retried by the core, never leaked raw), or None for anything else. httpx's
    and httpx2's errors of one name mean one thing."""
    library = library_of(type(exc))
    if library is not None:
        failures = (library.TransportError, library.DecodingError, library.TooManyRedirects)
        if not isinstance(exc, failures):
            return None
        # After these the request surely never reached the server.
        never_sent = (library.ConnectError, library.ConnectTimeout, library.PoolTimeout)
        sent, timeout = not isinstance(exc, never_sent), isinstance(exc, library.TimeoutException)
    elif isinstance(exc, TimeoutError):  # a cancel scope ended the whole request
        sent, timeout = True, True
    elif isinstance(exc, ReplyTooLarge):
        sent, timeout = True, False
    else:
        return None
    log.debug("request failed: %s", type(exc).__name__)
    return TransportFailure(sent=sent, timeout=timeout, error=exc)


def download_headers(agent: str = USER_AGENT) -> dict[str, str]:
    return {"User-Agent": agent}


def download_request(
    http: HttpClient, settings: Settings, fetch: Fetch, agent: str = USER_AGENT
) -> httpx.Request:
    """The first request of a result download: no credentials, the fetch's time limits. Sent
    with ``auth=None``, as every hop of a download is (see :func:`without_credentials`)."""
    request = http.build_request(
        "GET",
        fetch.url,
        headers=download_headers(agent),
        extensions={"timeout": request_timeout(settings, fetch.timeout)},
    )
    return without_credentials(http, request)


# The headers by which a caller's HTTP client may carry their credentials (``headers=`` on the
# client, a proxy's login, cookies): never sent to a result host, which may be anyone's.
_CREDENTIALS = (surfaces.AUTHORIZATION_HEADER, "Proxy-Authorization", "Cookie")


def without_credentials(http: HttpClient, request: httpx.Request) -> httpx.Request:
    """``request``, a result download's (its first hop or a redirect's), with none of the
    credentials ``http`` puts on what it sends: no ``Authorization``, ``Proxy-Authorization``
    or ``Cookie`` header from the client. Its ``auth=`` is left out by sending with
    ``auth=None``, which skips the client's own (httpx and httpx2 alike); a link's own userinfo
    still logs in to its own host, as httpx does for any URL.

    Cookies: a cookie in the client's jar that names no domain (``httpx.Client(cookies=...)``,
    ``cookies.set(name, value)``) is sent by the jar to every host, so it never goes to a
    result host. One the jar scopes to a domain (set by a host's own ``Set-Cookie``, or given
    with ``domain=``) goes where the jar sends it, to a host of that domain only: a CDN's
    cookie for the next hop of its own redirect is kept, another host's never sent."""
    for name in _CREDENTIALS:
        request.headers.pop(name, None)
    jar = http.cookies.jar
    if len(jar):
        scoped = (library_of(type(http)) or httpx).Cookies()
        for cookie in jar:
            if cookie.domain:
                scoped.jar.set_cookie(cookie)
        scoped.set_cookie_header(request)
    return request


def hops(http: HttpClient) -> range:
    """The requests one download may send: the link's, and as many redirects as ``http``
    follows (``max_redirects``, as httpx counts them)."""
    return range(http.max_redirects + 1)


def _origin(url: httpx.URL) -> Origin:
    port = url.port or {"http": 80, "https": 443}.get(url.scheme, 0)
    return url.scheme, url.host, port


def redirect(
    http: HttpClient, fetch: Fetch, link: httpx.URL, response: httpx.Response
) -> httpx.Request | None:
    """The request a download's response redirects to (``http`` builds it: method, headers,
    cookies; then :func:`without_credentials`), None when it is no redirect. A redirect that
    leaves ``link``'s origin for a loopback, private or link-local host (``_core/origins.py``)
    raises :class:`DownloadError` (``redirect_refused``), before anything is sent there: not a
    fault of the network, never tried again."""
    following: httpx.Request | None = response.next_request
    if following is None:
        return None
    kind = refused_redirect(_origin(link), _origin(following.url))
    if kind is not None:
        raise DownloadError(
            f"result {fetch.stem}: its link at {link_origin(str(link))} redirected to "
            f"{link_origin(str(following.url))}, a {kind} host of another origin; a download "
            "never follows a redirect there, and nothing was saved",
            code=REDIRECT_REFUSED,
        )
    return without_credentials(http, following)


def too_many_redirects(http: HttpClient, request: httpx.Request) -> Exception:
    """The error ``http``'s library raises past its redirects (a failure of the exchange)."""
    library = library_of(type(http)) or httpx
    error: Exception = library.TooManyRedirects(
        "Exceeded maximum allowed redirects.", request=request
    )
    return error


# ---------------------------------------------------------------------------- the connection


# HTTP clients a forked process inherited from its parent: their sockets are the parent's too.
# Kept, never closed (closing could send a TLS close_notify or an HTTP/2 GOAWAY on the parent's
# connections) and never used; one per client and fork, gone when the process ends.
_INHERITED: list[object] = []


class Guard(Protocol):
    """What closes the HTTP client made for one event loop, on that loop, when it ends (the
    asynchronous driver's)."""

    async def close(self) -> None:
        """Closes it now, on its loop (the running one)."""

    def close_soon(self) -> None:
        """Closes it on its loop, running in another thread, without waiting."""

    def dropped(self) -> None:
        """Its connection was let go: closed on its loop by the loop, or, a loop that is
        closed, by nothing (never an error at that loop's expense)."""


class Connection(Generic[H]):
    """The HTTP client behind a client and all its ``with_options`` copies. ``factory`` makes a
    fresh one (None for a caller's own client, or one over a transport that pools connections:
    neither can be replaced).

    Connections belong to the process that opened them: after a ``fork()`` the child holds the
    parent's very sockets, and two processes writing requests on one keep-alive connection read
    each other's answers (one task id handed to two submits: a paid task no one owns). So
    before each request the process is checked (a PID check, not an at-fork hook: it holds
    for a fork made in C too, and keeps no registry of clients): in a child our own HTTP client
    is set aside unclosed (the parent's to use and close) and a new one made; a caller's own
    one, or a pooled transport's, that this client sent requests through before the fork is
    refused. One that sent nothing before the fork holds no connection of ours: kept.

    An ``AsyncClient``'s connections belong to the event loop that opened them, so each loop
    that uses the client (one ``asyncio.run`` after another, threads each with a loop of their
    own) gets an HTTP client of its own (``bound``, when ``per_loop``), made by ``factory``; the
    driver closes it on that loop when the loop ends (``keep``), since after that nothing can.
    Over a caller's transport (not ``per_loop``), the HTTP client is made anew on a new loop
    and the one before let go: the transport, closed once by ``close``, holds the
    connections."""

    def __init__(
        self, http: H, *, owned: bool, factory: Callable[[], H] | None, per_loop: bool = False
    ) -> None:
        self.http: H = http  # the one made (or given) last: the client's, while it has one loop
        self.owned = owned
        self.factory: Callable[[], H] | None = factory
        # Each of its HTTP clients pools connections of its own: one per event loop (else
        # the caller's transport holds them, and one closed would close it for every loop).
        self.per_loop = per_loop
        self.loop: object = None  # the event loop ``http``'s connections belong to
        self.bound: dict[object, H] = {}  # event loop -> the HTTP client made for it
        self.guards: dict[object, Guard] = {}  # event loop -> what closes its HTTP client
        self.shut = False  # closed by the client that owns it
        self.pid = os.getpid()  # the process whose connections ``http`` holds
        self.used = False  # whether a request went through ``http`` in that process
        self._fork_lock = threading.Lock()
        self._lock = threading.Lock()  # threads, each with an event loop, claim at once

    @property
    def mine(self) -> bool:
        """Whether ``http`` is this process's (False in a child forked after it was made,
        until the child makes its own)."""
        return self.pid == os.getpid()

    @property
    def closed(self) -> bool:
        """Closed by its owner (or, a caller's own HTTP client, by the caller)."""
        return self.shut or (not self.owned and self.http.is_closed)

    def claim(self, loop: object) -> tuple[H, bool]:
        """Called before every request: the HTTP client for ``loop``, and whether it was made
        for it now (the driver then arranges its close at the loop's end). In a process
        forked since ``http`` was made, the connections are the parent's: see the class.
        Then, connections belong to the event loop that opened them; one used from another
        loop fails after the request was written (a task billed, the answer lost). So a loop
        gets an HTTP client of its own before anything is sent, and one that cannot be made
        is refused. Threads have no loop (``None``): nothing to do."""
        if self.pid != os.getpid():  # not self.mine: asked before every request
            self._forked()
        self.used = True
        if loop is None:
            return self.http, False
        factory = self.factory
        if factory is None or not self.per_loop:
            if self.loop is None or self.loop is loop:
                self.loop = loop
                return self.http, False
            if factory is None:
                raise ConfigurationError(
                    "this AsyncClient's connections were opened under another event loop (its "
                    "http_client's, or its transport's pool); make the client (and its "
                    "http_client or transport) inside the event loop that uses it"
                )
            # Over the caller's transport, which holds what connections there are.
            self.http, self.loop = factory(), loop
            return self.http, False
        http = self.bound.get(loop)  # the usual case, without the lock
        if http is not None:
            return http, False
        with self._lock:
            unused = self.loop is None and not self.http.is_closed  # made with the client
            http = self.http if unused else factory()
            self.http, self.loop = http, loop
            self.bound[loop] = http
            # Loops closed without ending their runs (loop.close() alone): their connections
            # can be closed by nothing now; their HTTP clients are let go.
            stale = [
                guard
                for old, guard in self.guards.items()
                if isinstance(old, asyncio.AbstractEventLoop) and old.is_closed()
            ]
        for guard in stale:
            guard.dropped()
        return http, True

    def keep(self, loop: object, guard: Guard) -> None:
        """Holds what closes ``loop``'s HTTP client when that loop ends (the driver's)."""
        with self._lock:
            self.guards[loop] = guard

    def ended(self, loop: object, http: object) -> None:
        """``loop`` ended (or the client was closed), and ``http``, its HTTP client, with it."""
        with self._lock:
            if self.bound.get(loop) is http:
                del self.bound[loop]
                self.guards.pop(loop, None)
            if self.loop is loop:
                self.loop = None  # ``http`` is closed: the next loop makes one anew

    def _forked(self) -> None:
        with self._fork_lock:  # the child's threads may all send their first request at once
            if self.mine:
                return
            if not self.used:  # no request went through it: it holds no connection of ours
                self.pid = os.getpid()
                return
            if self.factory is None:
                raise ConfigurationError(
                    "this client sent requests through its http_client (or its "
                    f"transport's pool) in process {self.pid}, and this process was forked "
                    "from it: those connections are shared with it, and requests from both "
                    "would mix on one socket. Make the client and its http_client in this "
                    "process (after the fork: a pool initializer, gunicorn's post_fork), or "
                    "let the client make its own (no http_client=): it makes a new one in "
                    "each process by itself"
                )
            # The parent's HTTP clients, and what would close them at its loops' ends (each
            # closes nothing outside the process that made it): kept, never used.
            _INHERITED.extend([self.http, *self.bound.values(), *self.guards.values()])
            self._lock = threading.Lock()  # a thread of the parent may have held it
            self.bound, self.guards = {}, {}
            self.http, self.loop = self.factory(), None
            self.pid, self.used = os.getpid(), False

    def __del__(self) -> None:
        # The client (and every with_options copy of it) was dropped unclosed: the HTTP client
        # it made is closed here, so that no socket is left to the garbage collector
        # (a ResourceWarning under -X dev). Never a caller's own, nor a parent process's. One
        # made for an event loop is closed on that loop by its guard, dropped with this.
        if not getattr(self, "owned", False) or not self.mine:
            return
        with contextlib.suppress(Exception):  # at interpreter exit, say: nothing left to do
            for guard in list(self.guards.values()):
                guard.dropped()
            if self.http not in self.bound.values():
                _close_dropped(self.http, self.loop)


# An AsyncClient's pool closed by the garbage collector: kept until the close has run.
_CLOSING: set[asyncio.Task[None]] = set()


def _close_dropped(http: httpx.Client | httpx.AsyncClient, loop: object) -> None:
    """Closes a dropped client's HTTP client. A blocking one at once; an asynchronous one on
    the asyncio loop its connections belong to, while that loop runs (as openai-python does):
    under a loop that has ended, nothing can close them any more."""
    if http.is_closed:
        return
    if isinstance(http, httpx.Client):
        http.close()
        return
    if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_closed():
        return

    def start() -> None:
        task = loop.create_task(http.aclose())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        start()
    elif loop.is_running():  # collected in another thread
        loop.call_soon_threadsafe(start)
