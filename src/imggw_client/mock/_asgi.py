"""The real-socket adapter: an ASGI app over a MockGateway, and uvicorn to serve it.

Result links name the address the server answered on (the socket's own), never a ``Host``
header the client sent. Slow clients are cut off: a whole request (head and body) must arrive
within ``request_timeout`` seconds of connecting or of the previous answer, idle keep-alive
connections close after 5 s, and a request head still incomplete past 16 KiB is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import anyio

from .._core import rules
from ._messages import Gateway, MockRequest

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class DroppedConnection(Exception):
    """Raised inside the app to make the server close a connection mid-answer (a fault)."""


class ASGIApp:
    """The gateway as an ASGI application (for uvicorn or any ASGI server)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > rules.BODY_MAX_BYTES or not message.get("more_body"):
                break  # past the limit, the rest is not worth reading: the answer is 413
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request = MockRequest(
            method=scope["method"],
            path=scope["path"],
            query=dict(urllib.parse.parse_qsl(scope["query_string"].decode("latin-1"))),
            headers=headers,
            body=bytes(body),
            base_url=origin(scope),
        )
        answer = self.gateway.handle(request)
        if answer.delay:
            await anyio.sleep(answer.delay)
        if answer.drop:
            # ASGI cannot close a socket; promising a body and abandoning it makes the
            # server close the connection, which the client sees as a lost answer.
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-length", b"1")],
                }
            )
            raise DroppedConnection
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
        out.append((b"content-length", str(len(answer.body)).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        if answer.truncate:
            half = answer.body[: len(answer.body) // 2]
            await send({"type": "http.response.body", "body": half, "more_body": True})
            raise DroppedConnection
        await send({"type": "http.response.body", "body": answer.body})


def origin(scope: Scope) -> str:
    """``scheme://host:port`` of the socket that took the connection. A ``Host`` header is the
    client's to choose; reflected into result links, it would send downloads anywhere."""
    host, port = scope.get("server") or ("127.0.0.1", None)
    if ":" in host:
        host = f"[{host}]"
    return f"{scope.get('scheme', 'http')}://{host}" + (f":{port}" if port else "")


class _QuietDrops(logging.Filter):
    """Keeps the server's log free of the faults we inject on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], DroppedConnection))


def quiet_injected_faults() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in logger.filters):
        logger.addFilter(_QuietDrops())


KEEP_ALIVE_SECONDS = 5
MAX_REQUEST_HEAD_BYTES = 16 * 1024


def timed_protocol(request_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline on reading each request.

    uvicorn times out only idle keep-alive connections, and forgets that timer at the first
    byte: a client that trickles its headers a byte at a time would hold a connection for
    ever. Here a whole request must arrive within ``request_timeout`` seconds of the
    connection opening or of the previous answer, or the connection is closed."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.DONE:  # the whole request is in
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is not h11.DONE:  # waiting for the next request
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(request_timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol


@contextlib.contextmanager
def serve_app(
    app: Any, host: str = "127.0.0.1", port: int = 0, *, request_timeout: float = 10.0
) -> Iterator[str]:
    """Serves any ASGI app with uvicorn on a background thread; yields the base URL; stops it
    cleanly on exit. ``port=0`` picks a free ephemeral port; a client that takes longer than
    ``request_timeout`` seconds to send a request is cut off.
    """
    import uvicorn  # only here: the SDK itself never needs a server

    quiet_injected_faults()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
        http=timed_protocol(request_timeout),
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="imggw-mock", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"could not serve on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{host}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def serve(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> ContextManager[str]:
    """Serves the gateway over a real socket; see serve_app."""
    timeout = gateway.config.request_timeout
    return serve_app(ASGIApp(gateway), host, port, request_timeout=timeout)
