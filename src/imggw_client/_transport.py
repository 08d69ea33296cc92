"""The one place that knows httpx: core wire values to httpx requests and back.

A caller's own HTTP client may be an ``httpx`` one or an ``httpx2`` one (Pydantic's
continuation of httpx: the same API with its own classes, which openai-python 3 and other SDKs
hand their users). Whatever is asked of a client's classes (its timeouts, its errors) is asked
of the library that made it, found by name, so httpx2 is imported only by those who use it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

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

# The libraries whose clients are taken as ``http_client=``: the same API, each its own classes.
LIBRARIES = ("httpx", "httpx2")
# Headers every client of theirs carries by default (see build_request).
_SET_LATER = frozenset({"accept", "user-agent"})
# An HTTP client's class: whether it builds as its library does (an entry a class a process uses)
_PLAIN: dict[type, bool] = {}
# The User-Agent each of them sends when its caller sets none.
_THEIR_DEFAULT_AGENTS = tuple(f"python-{name}/" for name in LIBRARIES)


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
