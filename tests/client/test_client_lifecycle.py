"""A client's life: per-call settings, closing it (also from elsewhere, mid-call), and an
AsyncClient used under one event loop after another. Against the reference gateway over a real
loopback socket."""

from __future__ import annotations

import asyncio
import copy
import gc
import pickle
import threading
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client import (
    AsyncClient,
    Client,
    ClientClosedError,
    ConfigurationError,
    PollPolicy,
    RateLimit,
    RetryPolicy,
    UnknownOutcomeError,
)
from imggw_client.mock import IN_PROCESS_URL, MockGateway

from ..loopback import raw_server

FAST = PollPolicy(initial_interval=0.02, max_interval=0.05)


# ---------------------------------------------------------------------------- with_options


pytestmark = pytest.mark.gateway(duration_min=30, duration_max=30)  # tasks that stay running


def test_with_options_changes_only_the_copy_and_shares_pool_and_budget(gateway_url: str) -> None:
    client = Client(
        api_key="test-key",
        base_url=gateway_url,
        timeout=30,
        poll=FAST,
        rate_limit=RateLimit(queries_per_second=50),
    )
    quick = client.with_options(timeout=5, max_retries=1, poll=PollPolicy(initial_interval=2.0))
    assert quick.timeout == 5.0
    assert quick.retry.max_attempts == 2
    assert quick.poll.initial_interval == 2.0
    assert client.timeout == 30.0  # the original is unchanged
    assert client.retry.max_attempts == 6
    assert client.poll == FAST
    assert quick._http is client._http  # one connection pool
    assert quick._flows.budget is client._flows.budget  # one budget
    assert quick.rate_limit == client.rate_limit
    retry = RetryPolicy(max_attempts=9)
    assert client.with_options(retry=retry).retry is retry
    sub = quick.submit("a lighthouse")
    assert client.get(sub.task_id).id == sub.task_id
    quick.close()  # closing the copy leaves the original working
    assert client.get(sub.task_id).id == sub.task_id
    with pytest.raises(ClientClosedError):
        quick.get(sub.task_id)
    client.close()


def test_a_plain_copy_is_a_with_options_copy_and_a_client_is_never_pickled(
    gateway: MockGateway, gateway_url: str
) -> None:
    client = Client(api_key="test-key", base_url=gateway_url)
    copied = copy.copy(client)
    sub = copied.submit("a lighthouse")
    copied.close()  # closes only the copy, as a with_options copy's close does
    assert client.get(sub.task_id).id == sub.task_id
    assert copy.copy(client).get(sub.task_id).id == sub.task_id
    for pickled in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be pickled or deep-copied"):
            pickled(client)
    client.close()
    assert copied.is_closed


@pytest.mark.parametrize(
    "changes",
    [
        {"timeout": 0},
        {"timeout": -1},
        {"max_retries": -1},
        {"max_retries": 1.5},
        {"retry": "x"},
        {"poll": 3},
        {"retry": RetryPolicy(), "max_retries": 2},
    ],
)
def test_with_options_checks_what_it_is_given(changes: dict[str, object]) -> None:
    client = Client(api_key="test-key", base_url="http://127.0.0.1:9")
    with pytest.raises(ConfigurationError):
        client.with_options(**changes)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_async_with_options_shares_the_budget(gateway_url: str) -> None:
    async with AsyncClient(api_key="test-key", base_url=gateway_url) as client:
        copy = client.with_options(timeout=3)
        assert copy._flows.budget is client._flows.budget
        assert copy._http is client._http
        sub = await copy.submit("a fox")
        assert (await client.get(sub.task_id)).id == sub.task_id


# ---------------------------------------------------------------------------- closing


def test_a_closed_client_says_so_and_sends_nothing(gateway: MockGateway, gateway_url: str) -> None:
    client = Client(api_key="test-key", base_url=gateway_url)
    client.close()
    before = gateway.stats()["requests"]
    with pytest.raises(ClientClosedError):
        client.get("1")
    with pytest.raises(ClientClosedError):
        client.submit("a lighthouse")  # nothing was sent: not an unknown outcome
    assert gateway.stats()["requests"] == before


def test_close_from_another_thread_ends_a_wait_with_an_imggw_error(gateway_url: str) -> None:
    client = Client(api_key="test-key", base_url=gateway_url, poll=FAST)
    sub = client.submit("a lighthouse")
    waiting = threading.Event()  # the wait has had its first answer: it is under way

    def close_once_waiting() -> None:
        if waiting.wait(timeout=10):
            client.close()

    closer = threading.Thread(target=close_once_waiting)
    closer.start()
    # Ended by the close, not by the wait's own 30 s: that would be a WaitTimeoutError.
    with pytest.raises(ClientClosedError):
        client.wait(sub, wait_timeout=30, on_update=lambda task: waiting.set())
    closer.join(timeout=10)
    assert waiting.is_set()


@pytest.mark.anyio
async def test_close_from_another_task_ends_an_async_wait_with_an_imggw_error(
    gateway_url: str,
) -> None:
    client = AsyncClient(api_key="test-key", base_url=gateway_url, poll=FAST)
    sub = await client.submit("a lighthouse")
    waiting = asyncio.Event()  # the wait has had its first answer: it is under way

    async def close_once_waiting() -> None:
        await asyncio.wait_for(waiting.wait(), timeout=10)
        await client.close()

    closer = asyncio.ensure_future(close_once_waiting())
    with pytest.raises(ClientClosedError):
        await client.wait(sub, wait_timeout=30, on_update=lambda task: waiting.set())
    await closer


class ClosedAtFirstRecord:
    """Wraps a client's journal: its first write lets ``close`` land first, as a close from
    another thread (or task) does between a call's start and the submit's own row."""

    def __init__(self, client: Client | AsyncClient) -> None:
        self.client, self.fired = client, False
        journal = client.journal
        assert journal is not None
        self.record, self.try_record = journal.record, journal.try_record
        journal.record = self.on_record  # type: ignore[method-assign]
        journal.try_record = self.on_try_record  # type: ignore[method-assign]

    def close_first(self) -> None:
        if not self.fired:
            self.fired = True
            journal = self.client.journal
            assert journal is not None
            self.client._closed = True  # what close() does first, then the journal's close
            journal.close()

    def on_record(self, event: Any, scope: Any) -> None:
        self.close_first()
        self.record(event, scope)

    def on_try_record(self, event: Any, scope: Any) -> bool:
        self.close_first()
        return self.try_record(event, scope)


def test_a_call_whose_client_is_closed_before_its_first_record_says_client_closed(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    client = Client(api_key="test-key", base_url=gateway_url, journal=tmp_path / "j.sqlite")
    closing = ClosedAtFirstRecord(client)
    with pytest.raises(ClientClosedError):  # not the journal's "closed": nothing was sent
        client.generate("a lighthouse")
    assert closing.fired
    assert gateway.stats()["tasks_created"] == 0
    client.close()


@pytest.mark.anyio
async def test_an_async_call_whose_client_is_closed_before_its_first_record_says_so(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    client = AsyncClient(api_key="test-key", base_url=gateway_url, journal=tmp_path / "j.sqlite")
    closing = ClosedAtFirstRecord(client)
    with pytest.raises(ClientClosedError):
        await client.submit("a lighthouse")
    assert closing.fired
    assert gateway.stats()["tasks_created"] == 0
    await client.close()


@pytest.mark.slow
def test_a_submit_cut_short_by_close_keeps_its_key() -> None:
    # A gateway that takes the submit and never answers: close() lands once it has the
    # request, so while the request is in flight.
    arrived, release, attempts = threading.Event(), threading.Event(), []

    def hold(conn: Any, n: int, request: bytes) -> None:
        attempts.append(n)
        arrived.set()
        release.wait(timeout=30)

    with raw_server(hold) as base_url:
        client = Client(
            api_key="test-key",
            base_url=base_url,
            timeout=1.0,
            retry=RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02),
        )
        threading.Thread(target=lambda: arrived.wait(timeout=10) and client.close()).start()
        with pytest.raises(UnknownOutcomeError) as info:
            client.submit("a lighthouse", idempotency_key="key-cut-short-by-close")
        sent = list(attempts)
        release.set()
    assert info.value.idempotency_key == "key-cut-short-by-close"
    assert sent == [1]  # the attempt in flight, then no more (3 were allowed)


# ---------------------------------------------------------------------------- event loops


# Each loop's connections are closed on that loop as it ends (its sockets would otherwise be
# open until the garbage collector finds them, then a ResourceWarning: an error here).
@pytest.mark.slow
def test_an_async_client_works_under_a_second_event_loop(
    gateway: MockGateway, gateway_url: str
) -> None:
    client = AsyncClient(api_key="test-key", base_url=gateway_url)
    used: list[httpx.AsyncClient] = []

    async def submit(prompt: str) -> str:
        sub = await client.submit(prompt)
        used.append(client._http)
        return sub.task_id

    first = asyncio.run(submit("a lighthouse"))
    assert used[0].is_closed  # closed as its loop ended
    second = asyncio.run(submit("a red fox"))  # the first loop, and its sockets, are gone
    assert used[1] is not used[0]
    assert used[1].is_closed
    assert first != second
    assert gateway.stats()["tasks_created"] == 2
    assert not client.is_closed  # a loop's end is not the client's
    asyncio.run(client.close())
    gc.collect()  # nothing left to report


def test_an_async_client_never_closed_leaves_no_socket_when_its_loop_ends(
    gateway_url: str,
) -> None:
    used: list[httpx.AsyncClient] = []

    async def main() -> None:
        client = AsyncClient(api_key="test-key", base_url=gateway_url)
        await client.submit("a lighthouse")
        used.append(client._http)

    with warnings.catch_warnings():  # what earlier tests of this process left is not this one's
        warnings.simplefilter("ignore")
        gc.collect()
    asyncio.run(main())
    gc.collect()  # a socket left open would be a ResourceWarning here: an error in this suite
    assert used[0].is_closed


def test_threads_each_with_an_event_loop_share_an_async_client_one_http_client_a_loop(
    gateway: MockGateway, gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[httpx.AsyncClient] = []

    def counted(**options: Any) -> httpx.AsyncClient:
        made.append(httpx.AsyncClient(**options))
        return made[-1]

    monkeypatch.setattr(AsyncClient, "make_http_client", staticmethod(counted))
    client = AsyncClient(api_key="test-key", base_url=gateway_url)
    threads = 4
    turns = threading.Barrier(threads)  # every loop sends, then every loop sends again
    errors: list[BaseException] = []

    async def work(n: int) -> None:
        sub = await client.submit(f"a lighthouse {n}")
        turns.wait(timeout=10)
        await client.get(sub.task_id)  # after the other loops' requests: still its own client

    def run(n: int) -> None:
        try:
            asyncio.run(work(n))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert errors == []
    assert len(made) == threads  # the one made with the client, then one for each other loop
    assert all(http.is_closed for http in made)  # each on its loop, as it ended
    assert gateway.stats()["tasks_created"] == threads
    asyncio.run(client.close())
    gc.collect()


def test_closing_an_async_client_closes_the_pool_of_a_loop_running_in_another_thread(
    gateway_url: str,
) -> None:
    client = AsyncClient(api_key="test-key", base_url=gateway_url)
    used, closed = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    async def owner() -> None:
        await client.submit("a lighthouse")
        http = client._http
        used.set()
        await asyncio.get_running_loop().run_in_executor(None, closed.wait, 10)
        for _ in range(1000):  # the close handed to this loop runs at its next turns
            if http.is_closed:
                break
            await asyncio.sleep(0)
        seen["closed while the loop runs"] = http.is_closed
        try:
            await client.get("1")
        except ClientClosedError:
            seen["refused"] = True

    thread = threading.Thread(target=lambda: asyncio.run(owner()))
    thread.start()
    assert used.wait(timeout=10)
    asyncio.run(client.close())  # on a loop of its own: the owner's loop still runs
    closed.set()
    thread.join(timeout=10)
    assert seen == {"closed while the loop runs": True, "refused": True}


# An event loop closed without ending its run (loop.close() alone, no asyncio.run): nothing
# can close its sockets any more, and they are reported when collected (filtered here). Its
# HTTP client is let go quietly: no "Event loop is closed" error at exit.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_loop_closed_without_ending_its_run_costs_no_error_when_the_client_goes(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    client = AsyncClient(api_key="test-key", base_url=gateway_url)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(client.submit("a lighthouse"))
    loop.close()
    asyncio.run(client.submit("a red fox"))  # a new loop: the closed one's client let go
    second = asyncio.new_event_loop()
    second.run_until_complete(client.submit("a blue fox"))
    second.close()
    del client, loop, second  # dropped with a closed loop's client still held
    gc.collect()  # here, under this test's filter: nothing of it left for a later test to meet
    errors = [hook.exc_value for hook in unraisable if hook.exc_value is not None]
    assert not [e for e in errors if not isinstance(e, ResourceWarning)], errors


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_callers_http_client_on_another_loop_is_refused_before_sending(
    gateway: MockGateway, gateway_url: str
) -> None:
    http = httpx.AsyncClient()
    client = AsyncClient(api_key="test-key", base_url=gateway_url, http_client=http)
    asyncio.run(client.submit("a lighthouse"))
    with pytest.raises(ConfigurationError, match="event loop"):
        asyncio.run(client.submit("a red fox"))
    assert gateway.stats()["tasks_created"] == 1  # nothing sent, nothing billed
    del client, http
    gc.collect()  # the caller's client died with its loop: reported here, under these filters


def test_a_gateway_wired_async_client_works_under_a_second_event_loop(gateway: MockGateway) -> None:
    client = gateway.async_client()
    asyncio.run(client.submit("a lighthouse"))
    asyncio.run(client.submit("a red fox"))
    assert gateway.stats()["tasks_created"] == 2
    asyncio.run(client.close())


# ---------------------------------------------------------------------------- transport=


class Recording(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """A transport (both kinds) over another that notes whether it was closed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.closed = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = self.inner.handle_request(request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = await self.inner.handle_async_request(request)
        return response

    def close(self) -> None:
        self.closed += 1

    async def aclose(self) -> None:
        self.closed += 1


def test_a_client_over_a_transport_owns_the_http_client_it_makes(gateway: MockGateway) -> None:
    transport = Recording(gateway.transport())
    client = Client(
        api_key=gateway.config.api_keys[0], base_url=IN_PROCESS_URL, transport=transport
    )
    copy = client.with_options(timeout=5)
    sub = copy.submit("a lighthouse")
    copy.close()  # a copy borrows the connection: it stays open
    assert transport.closed == 0
    assert client.get(sub.task_id).id == sub.task_id
    client.close()
    assert transport.closed == 1  # closed with the client that made it
    assert gateway.stats()["tasks_created"] == 1


@pytest.mark.anyio
async def test_an_async_client_over_a_transport_owns_the_http_client_it_makes(
    gateway: MockGateway,
) -> None:
    transport = Recording(gateway.transport())
    async with AsyncClient(
        api_key=gateway.config.api_keys[0], base_url=IN_PROCESS_URL, transport=transport
    ) as client:
        sub = await client.submit("a lighthouse")
        assert (await client.get(sub.task_id)).id == sub.task_id
        assert transport.closed == 0
    assert transport.closed == 1


def test_an_async_client_over_a_transport_makes_its_http_client_again_on_a_new_loop(
    gateway: MockGateway,
) -> None:
    transport = Recording(gateway.transport())
    client = AsyncClient(
        api_key=gateway.config.api_keys[0], base_url=IN_PROCESS_URL, transport=transport
    )

    async def then_close() -> None:
        await client.submit("a red fox")  # over the same transport: it holds no connections
        await client.close()

    asyncio.run(client.submit("a lighthouse"))
    asyncio.run(then_close())
    assert gateway.stats()["tasks_created"] == 2
    assert transport.closed == 1  # the HTTP client made on the second loop, closed there


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_pooling_transport_on_another_loop_is_refused_before_sending(
    gateway: MockGateway, gateway_url: str
) -> None:
    client = AsyncClient(
        api_key="test-key", base_url=gateway_url, transport=httpx.AsyncHTTPTransport()
    )
    asyncio.run(client.submit("a lighthouse"))
    with pytest.raises(ConfigurationError, match="event loop"):
        asyncio.run(client.submit("a red fox"))  # its pool's sockets died with the first loop
    assert gateway.stats()["tasks_created"] == 1  # nothing sent, nothing billed
    del client
    gc.collect()  # the pool died with its loop: reported here, under these filters


def test_the_settings_a_client_shows_are_read_only() -> None:
    client = Client(api_key="test-key", base_url="http://127.0.0.1:9", timeout=7, poll=FAST)
    assert (client.timeout, client.retry.max_attempts, client.poll) == (7.0, 6, FAST)
    for name in ("timeout", "retry", "poll"):
        with pytest.raises(AttributeError):
            setattr(client, name, None)
    client.close()
