"""A total deadline for blocking requests.

httpx's timeouts bound each network operation, not a request: a server that sends one byte
every half second never trips a read timeout and can hold a request for as long as it likes,
in its headers or its body. ``AsyncClient`` bounds a whole request with a cancel scope. A
blocking call cannot be cancelled, so the HTTP client that ``Client`` makes for itself gets a
network layer whose every read and write is bounded by the time left to the request (set with
:func:`bounded` around it). A caller's own ``httpx.Client`` keeps its network layer; the driver
then checks the deadline between the chunks of the body.
"""

from __future__ import annotations

import contextvars
import ssl
import time
import typing

import httpcore
import httpx

from ._transport import shared_tls

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "imggw_deadline", default=None
)


class bounded:  # used as a function: ``with bounded(seconds) as deadline``
    """Every network operation in this block ends within ``seconds`` of now; yields the
    deadline (monotonic seconds). A class, not a generator: it wraps every request."""

    __slots__ = ("_deadline", "_token")

    def __init__(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds

    def __enter__(self) -> float:
        self._token = _DEADLINE.set(self._deadline)
        return self._deadline

    def __exit__(self, *exc_info: object) -> None:
        _DEADLINE.reset(self._token)


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, left, local_address, socket_options))

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bounded_client(**options: typing.Any) -> httpx.Client:
    """An ``httpx.Client`` (``options`` as for httpx) whose connections honour :func:`bounded`,
    direct or through the proxies httpx takes from the environment. The network backends are
    reached through httpx's transport internals; if a future httpx moves them, the client
    still works and the driver's checks between body chunks remain."""
    client = httpx.Client(**shared_tls(options))
    for transport in (client._transport, *client._mounts.values()):
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, httpcore.NetworkBackend):
            pool._network_backend = _Backend(backend)  # type: ignore[union-attr]
    return client
