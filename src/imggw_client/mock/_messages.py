"""What the reference gateway's core and its adapters exchange: one request in, one answer out.

The adapters (``_transport`` for httpx, ``_asgi`` for a socket) know only this module and the
:class:`Gateway` protocol, never the core itself, so the core may offer them as conveniences
(``MockGateway.transport()``, ``.serve()``) without an import circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ._config import MockConfig

__all__ = ["IN_PROCESS_URL", "JSON_CONTENT", "Gateway", "MockRequest", "MockResponse"]

IN_PROCESS_URL = "http://imggw.mock"
JSON_CONTENT = ("content-type", "application/json")


@dataclass(frozen=True, slots=True)
class MockRequest:
    """An HTTP request as the adapters hand it over. Header names are lower case; a ``path``
    may carry its query (``/results/x.png?Expires=...``). ``base_url`` (``scheme://host[:port]``)
    is the origin result links name: the in-process URL, or the socket the server answered on,
    never a header the client chose.

    Example::

        answer = gateway.handle(MockRequest("GET", "/beta/v1/tasks/1",
                                            headers={"authorization": "Bearer test-key"}))
        print(answer.status, answer.body)
    """

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    base_url: str = IN_PROCESS_URL


@dataclass(frozen=True, slots=True)
class MockResponse:
    """The answer, and how to deliver it: after ``delay`` seconds; or never, the connection
    dropped (``drop``); or with the body cut short of its Content-Length (``truncate``).

    Example::

        MockResponse(200, b'{"reset":true}')
    """

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = (JSON_CONTENT,)
    delay: float = 0.0
    drop: bool = False
    truncate: bool = False


class Gateway(Protocol):
    """What an adapter needs of a gateway: its settings, and an answer to each request."""

    @property
    def config(self) -> MockConfig: ...

    def handle(self, request: MockRequest) -> MockResponse: ...
