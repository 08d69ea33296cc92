"""A reference gateway on a real socket whose answer to one submit is held: the task made and
billed, its answer not yet sent. For killing a client at the worst moment."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread

from imggw_client.mock import MockGateway

from .loopback import serve_asgi


class Holder:
    """The reference gateway, whose answer to the ``hold``-th submit waits (its task made and
    billed) until ``release``; ``arrived`` says it is held."""

    def __init__(self, gateway: MockGateway, hold: int = 1) -> None:
        self.app, self.hold, self.seen = gateway.asgi(), hold, 0
        self.arrived, self.release = threading.Event(), threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        self.seen += 1
        if self.seen != self.hold:
            await self.app(scope, receive, send)
            return

        async def held(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.arrived.set()
                await anyio.to_thread.run_sync(self.release.wait)
            await send(message)

        with contextlib.suppress(OSError, RuntimeError):  # the client is gone by then
            await self.app(scope, receive, held)


@contextlib.contextmanager
def held_gateway(gateway: MockGateway, hold: int = 1) -> Iterator[tuple[Holder, str]]:
    """``gateway`` served on 127.0.0.1 with its ``hold``-th submit's answer held."""
    holder = Holder(gateway, hold)
    with serve_asgi(holder) as url:
        try:
            yield holder, url
        finally:
            holder.release.set()  # the held answer goes (nowhere), and the server can stop
