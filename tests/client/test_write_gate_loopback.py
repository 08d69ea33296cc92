"""A paced request waits for its turn again right before the wire (DESIGN 9), over a real
loopback socket: queries whose slots came while every pooled connection was busy reach the
gateway spaced at the ceiling, not together the moment a connection frees."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from imggw_client import AsyncClient, Client, RateLimit
from imggw_client.mock import MockGateway

from ..loopback import asgi_body, serve_asgi

RATE = 10.0  # queries per second: one each 0.101 s (the guard included)
QUERIES = 4
HELD = "hold the connection"  # a submit with this prompt is answered only once released


class Gateway:
    """The reference gateway behind a recorder: when each query arrived, and a submit it holds
    (keeping the client's only connection busy) until ``release`` is set."""

    def __init__(self) -> None:
        self.mock = MockGateway(api_keys=["test-key"])
        self.inner = self.mock.asgi()
        self.queries: list[float] = []
        self.holding = threading.Event()
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and "/tasks/" in scope["path"]:
            self.queries.append(time.monotonic())
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        body = await asgi_body(receive)
        if HELD.encode() in body:
            self.holding.set()
            await anyio.to_thread.run_sync(self.release.wait, 30)
        replayed = iter([{"type": "http.request", "body": body, "more_body": False}])
        await self.inner(scope, lambda: _next(replayed, receive), send)

    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.queries)]


async def _next(replayed: Iterator[dict[str, Any]], receive: Any) -> Any:
    with contextlib.suppress(StopIteration):
        return next(replayed)
    return await receive()


def granted(client: Client | AsyncClient) -> bool:
    """Whether every query has had its slot (private state, read by the test only)."""
    lane = client._flows.budget._lanes["query"]  # type: ignore[union-attr]
    return lane.next_place == QUERIES and not lane.held


@pytest.mark.slow
@pytest.mark.anyio
async def test_queries_held_in_the_pool_past_their_slots_reach_the_gateway_spaced() -> None:
    gateway = Gateway()
    one = httpx.AsyncClient(limits=httpx.Limits(max_connections=1))
    limit = RateLimit(queries_per_second=RATE)
    with serve_asgi(gateway) as url:
        async with (
            one,
            AsyncClient(
                api_key="test-key", base_url=url, rate_limit=limit, http_client=one
            ) as client,
        ):
            task_id = (await client.submit("a fox")).task_id
            async with anyio.create_task_group() as group:
                group.start_soon(client.submit, HELD)
                await anyio.to_thread.run_sync(gateway.holding.wait, 30)
                for _ in range(QUERIES):
                    group.start_soon(client.get, task_id)
                with anyio.fail_after(30):
                    while not granted(client):  # each slot comes while the connection is held
                        await anyio.sleep(0.01)
                gateway.release.set()
    assert len(gateway.queries) == QUERIES
    # Out of the pool they would go back to back (a round trip apart, about a millisecond);
    # the gate spaces them an interval apart, less its 5 ms slack: half an interval leaves
    # room for the gateway's own clock to be late for one of them.
    assert min(gateway.gaps()) >= 0.5 / RATE


@pytest.mark.slow
def test_threads_whose_queries_the_pool_held_reach_the_gateway_spaced() -> None:
    gateway = Gateway()
    limit = RateLimit(queries_per_second=RATE)
    one = httpx.Client(limits=httpx.Limits(max_connections=1))
    with (
        serve_asgi(gateway) as url,
        one,
        Client(api_key="test-key", base_url=url, rate_limit=limit, http_client=one) as client,
    ):
        task_id = client.submit("a fox").task_id
        threads = [threading.Thread(target=client.submit, args=(HELD,))]
        threads[0].start()
        assert gateway.holding.wait(30)
        threads += [threading.Thread(target=client.get, args=(task_id,)) for _ in range(QUERIES)]
        for thread in threads[1:]:
            thread.start()
        deadline = time.monotonic() + 30
        while not granted(client) and time.monotonic() < deadline:  # as each slot comes
            time.sleep(0.01)
        gateway.release.set()
        for thread in threads:
            thread.join(30)
    assert len(gateway.queries) == QUERIES
    assert min(gateway.gaps()) >= 0.5 / RATE
