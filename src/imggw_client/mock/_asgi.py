"""The real-socket adapter: an ASGI app over a MockGateway, and uvicorn to serve it."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, Any

import anyio

from .._core import rules
from ._gateway import MockRequest

if TYPE_CHECKING:
    from ._gateway import MockGateway

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class DroppedConnection(Exception):
    """Raised inside the app to make the server close a connection mid-answer (a fault)."""


class ASGIApp:
    """The gateway as an ASGI application (for uvicorn or any ASGI server).

    Example::

        uvicorn.run(gateway.asgi(), host="127.0.0.1", port=8000)
    """

    def __init__(self, gateway: MockGateway) -> None:
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
        server = scope.get("server") or ("127.0.0.1", 80)
        host = headers.get("host") or f"{server[0]}:{server[1]}"
        request = MockRequest(
            method=scope["method"],
            path=scope["path"],
            query=dict(urllib.parse.parse_qsl(scope["query_string"].decode("latin-1"))),
            headers=headers,
            body=bytes(body),
            base_url=f"{scope.get('scheme', 'http')}://{host}",
        )
        answer = self.gateway.handle(request)
        if answer.delay:
            await anyio.sleep(answer.delay)
        if answer.drop:
            # ASGI cannot close a socket; promising a body and abandoning it makes the
            # server close the connection, which the client sees as a lost answer.
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"1")]})  # fmt: skip
            raise DroppedConnection
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
        out.append((b"content-length", str(len(answer.body)).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        if answer.truncate:
            half = answer.body[: len(answer.body) // 2]
            await send({"type": "http.response.body", "body": half, "more_body": True})
            raise DroppedConnection
        await send({"type": "http.response.body", "body": answer.body})


class _QuietDrops(logging.Filter):
    """Keeps the server's log free of the faults we inject on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], DroppedConnection))


def quiet_injected_faults() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in logger.filters):
        logger.addFilter(_QuietDrops())


@contextlib.contextmanager
def serve_app(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serves any ASGI app with uvicorn on a background thread; yields the base URL; stops it
    cleanly on exit. ``port=0`` picks a free ephemeral port."""
    import uvicorn  # only here: the SDK itself never needs a server

    quiet_injected_faults()
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off", access_log=False
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


def serve(gateway: MockGateway, host: str = "127.0.0.1", port: int = 0) -> ContextManager[str]:
    """Serves the gateway over a real socket; see serve_app."""
    return serve_app(ASGIApp(gateway), host, port)
