"""The in-process adapter: an httpx transport (sync and async) over a MockGateway.

Result links always name ``IN_PROCESS_URL``: the transport answers whatever host a request
names, so that origin reaches this gateway from any client built on the transport.
"""

from __future__ import annotations

import time

import anyio
import httpx

from ._messages import Gateway, MockRequest, MockResponse


class MockTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Routes an ``httpx.Client`` or ``httpx.AsyncClient`` to a gateway, with no sockets."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        answer = self.gateway.handle(_to_mock(request))
        if answer.delay:
            time.sleep(answer.delay)
        return _deliver(request, answer)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        answer = self.gateway.handle(_to_mock(request))
        if answer.delay:
            await anyio.sleep(answer.delay)
        return _deliver(request, answer)


def _to_mock(request: httpx.Request) -> MockRequest:
    url = request.url
    return MockRequest(
        method=request.method,
        path=url.path,
        query=dict(url.params),
        headers={k.lower(): v for k, v in request.headers.items()},
        body=request.content,
    )


def _deliver(request: httpx.Request, answer: MockResponse) -> httpx.Response:
    if answer.drop:
        # What httpx itself raises when a server closes without answering.
        raise httpx.RemoteProtocolError(
            "Server disconnected without sending a response.", request=request
        )
    body = answer.body[: len(answer.body) // 2] if answer.truncate else answer.body
    headers = [*answer.headers, ("content-length", str(len(answer.body)))]
    return httpx.Response(answer.status, headers=headers, content=body, request=request)
