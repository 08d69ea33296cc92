"""One key, many processes (DESIGN 16): the request budget shared through a real Redis store,
against the reference gateway over loopback, and every way the store can fail."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
import respx
from typer.testing import CliRunner

from imggw_cli._app import app
from imggw_client import AsyncClient, Client, ConfigurationError, RateLimit, _rate_store
from imggw_client._core import shared_budget
from imggw_client.batch import run_batch
from imggw_client.mock import MockGateway

from ..conftest import beta_error, beta_submitted
from ..loopback import RedisServer, tcp_listener

KEY = "sk-shared-budget-canary-7f3a9c"
QUICK = {"duration_min": 0.05, "duration_max": 0.15}
pytestmark = pytest.mark.gateway(api_keys=[KEY], **QUICK)


@pytest.fixture
def redis(redis_store: RedisServer) -> RedisServer:
    return redis_store


@pytest.fixture
def rejoin_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that failed is tried again after 0.2 s instead of 5 s."""
    monkeypatch.setattr(_rate_store, "REJOIN_AFTER", 0.2)


def store_values(server: RedisServer) -> list[bytes]:
    """Every key and every value the store holds."""
    found: list[bytes] = []
    with contextlib.closing(server.client()) as store:
        for key in store.scan_iter():
            found.append(key)
            found.extend(b for pair in store.hgetall(key).items() for b in pair)
    return found


# ---------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://cache",
        "rediss://user:pw@cache.internal:6380/2",
        "unix:///run/redis.sock",
    ],
)
def test_a_store_url_of_each_scheme_is_taken(url: str) -> None:
    assert RateLimit(submits_per_second=2, store=url).store == url


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379",
        "redis://",
        "redis://:6379/0",
        "redis://cache:port/0",
        "redis://cache:6379/first",
        " redis://cache",
        "unix://",
        "",
        6379,
    ],
)
def test_a_bad_store_url_is_a_configuration_error(url: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^RateLimit.store must be a redis://"):
        RateLimit(store=url)


def test_the_stores_password_is_never_shown() -> None:
    limit = RateLimit(queries_per_second=10, store="redis://app:hunter2secret@cache:6379/0")
    assert "hunter2secret" not in repr(limit)
    assert "redis://***@cache:6379/0" in repr(limit)  # the user name too (DESIGN 18)
    with pytest.raises(ConfigurationError) as err:
        RateLimit(store="redis://app:hunter2secret@cache:notaport/0")
    assert "hunter2secret" not in str(err.value)


def test_without_the_redis_library_the_client_says_which_extra_before_sending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(500))  # type: ignore[func-returns-value]
    for make in (Client, AsyncClient):
        with pytest.raises(ConfigurationError, match=r"pip install 'imggw\[redis\]'"):
            make(
                api_key=KEY,
                base_url="http://127.0.0.1:9",
                transport=transport,  # type: ignore[operator]
                rate_limit=RateLimit(store="redis://127.0.0.1:6379/0"),
            )
    assert sent == []


def test_lanes_are_named_by_a_hash_never_by_the_key() -> None:
    from imggw_client._base_client import key_fingerprint

    fingerprint = key_fingerprint(KEY)
    one = shared_budget.lane_key(fingerprint, "https://a.example", "submit")
    assert KEY not in one
    assert one.startswith("imggw:budget:")
    assert one.endswith(":submit")
    assert one != shared_budget.lane_key(fingerprint, "https://b.example", "submit")
    assert one != shared_budget.lane_key(key_fingerprint(KEY + "x"), "https://a.example", "submit")


# ---------------------------------------------------------------------------- many processes

CHILD = textwrap.dedent(
    """
    import json, sys
    from imggw_client import Client, RateLimit, RateLimitError
    url, store, count = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
    limit = RateLimit(submits_per_second=5, queries_per_second=10, store=store)
    refused = 0
    with Client(api_key=sys.argv[4], base_url=url, rate_limit=limit, max_retries=6) as client:
        subs = []
        for i in range(count):
            try:
                subs.append(client.submit(f"shared {i}"))
            except RateLimitError:
                refused += 1
        for sub in subs:
            client.get(sub.task_id)
    print(json.dumps({"submitted": len(subs), "refused": refused}))
    """
)


def three_processes(url: str, store: str, count: int) -> list[dict[str, int]]:
    """Three processes at once, each submitting ``count`` tasks at the gateway's limits and
    querying each once; what each reports."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, store, str(count), KEY],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert KEY not in err
        reports.append(json.loads(out.splitlines()[-1]))
    return reports


@pytest.mark.slow
# The gateway's own limits: 5 submits and 10 queries in any 1 s, for the key.
@pytest.mark.gateway(submit_limit="5/1", query_limit="10/1")
def test_three_processes_through_one_store_meet_no_429_where_their_own_budgets_do(
    redis: RedisServer,
    served_gateway: tuple[MockGateway, str],
    make_gateway: Callable[..., MockGateway],
    serve_gateway: Callable[[MockGateway], str],
) -> None:
    shared, url = served_gateway
    reports = three_processes(url, redis.url, 6)
    assert [r["submitted"] for r in reports] == [6, 6, 6]
    stats = shared.stats()
    assert stats["rate_limited"] == 0  # no 1 s window ever went over either limit
    assert stats["tasks_created"] == 18
    assert KEY.encode() not in b"".join(store_values(redis))

    alone = make_gateway()
    three_processes(serve_gateway(alone), "", 6)
    assert alone.stats()["rate_limited"] > 0  # three budgets of 5/s each: 15/s at a 5/s gate
    assert alone.stats()["tasks_created"] == 18  # each 429 retried: still billed once


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_429_seen_by_one_client_pauses_another_on_the_same_store(
    redis: RedisServer,
) -> None:
    limit = RateLimit(submits_per_second=50, store=redis.url)
    base = "https://gateway.test"
    with respx.mock(base_url=base, assert_all_called=False) as gateway:
        route = gateway.post("/beta/v1/images/generations")
        route.side_effect = [
            beta_error(429, "rate_limited", retry_after="1"),
            beta_submitted("1"),
            beta_submitted("2"),
        ]
        ids: list[str] = []

        async def submit(client: AsyncClient, prompt: str) -> None:
            ids.append((await client.submit(prompt)).task_id)

        async with (
            AsyncClient(api_key=KEY, base_url=base, rate_limit=limit) as first,
            AsyncClient(api_key=KEY, base_url=base, rate_limit=limit) as second,
            anyio.create_task_group() as group,
        ):
            group.start_soon(submit, first, "meets the 429")
            while route.call_count < 1 or first_answer_pending(route):
                await anyio.sleep(0.005)
            paused_at = time.monotonic()
            await submit(second, "never saw one")
            waited = time.monotonic() - paused_at
        assert sorted(ids) == ["1", "2"]
    # The second client saw no 429 itself, but waited out the pause the first one met.
    assert waited >= 0.5, waited
    assert route.call_count == 3


@pytest.mark.anyio
async def test_the_async_store_warns_nothing_under_the_newest_redis(redis: RedisServer) -> None:
    """redis-py 8.2 warns when its asyncio client is handed the blocking ``Retry``: a user of
    ``RateLimit(store=)`` must see only the one warning DESIGN 16 promises (a lost store)."""
    limit = RateLimit(submits_per_second=50, store=redis.url)
    with respx.mock(base_url="https://gateway.test") as gateway:
        gateway.post("/beta/v1/images/generations").mock(return_value=beta_submitted("1"))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            async with AsyncClient(
                api_key=KEY, base_url="https://gateway.test", rate_limit=limit
            ) as client:
                assert (await client.submit("a fox")).task_id == "1"
    assert [str(w.message) for w in seen] == []
    # The store was used, not passed over: the lane it paced is in it.
    assert store_values(redis)


def first_answer_pending(route: Any) -> bool:
    """Whether the first call's answer (the 429) has not been handed out yet."""
    return route.calls.last.response is None


@pytest.mark.slow
def test_a_client_of_another_gateway_is_not_paused_by_a_429_on_this_one(redis: RedisServer) -> None:
    base = "https://gateway.test"
    with respx.mock(base_url=base, assert_all_called=False) as gateway:
        route = gateway.post("/beta/v1/images/generations")
        route.side_effect = [
            beta_error(429, "rate_limited", retry_after="1"),
            beta_submitted("1"),
            beta_submitted("2"),
        ]
        shared = RateLimit(submits_per_second=50, store=redis.url)
        with (
            Client(api_key=KEY, base_url=base, rate_limit=shared) as first,
            Client(api_key=KEY, base_url="https://other.test", rate_limit=shared) as other,
        ):
            first.submit("meets the 429")
            gateway.post("https://other.test/beta/v1/images/generations").mock(
                return_value=beta_submitted("9")
            )
            slept: list[float] = []
            other._sleep = slept.append  # type: ignore[method-assign]
            other.submit("another gateway: another lane")
    assert route.call_count == 2
    # Its lane never heard of the 429: the store let it go at once (the pause the first client
    # met would have been a sleep of about 1 s here).
    assert sum(slept) == 0, slept


@pytest.mark.slow
def test_a_ceiling_holds_on_a_lane_a_client_without_one_made_first(redis: RedisServer) -> None:
    # The lane's first process set its mode for all: a web app with no ceiling first, then a
    # batch with RateLimit(submits_per_second=10) went unspaced (4 submits in 0.01 s).
    base = "https://gateway.test"
    with respx.mock(base_url=base) as gateway:
        route = gateway.post("/beta/v1/images/generations").mock(return_value=beta_submitted("1"))
        unlimited = RateLimit(store=redis.url)
        ceiling = RateLimit(submits_per_second=10, store=redis.url)
        with (
            Client(api_key=KEY, base_url=base, rate_limit=unlimited) as web,
            Client(api_key=KEY, base_url=base, rate_limit=ceiling) as batch,
        ):
            web.submit("the lane's first request")
            sent: list[float] = []
            for n in range(4):
                batch.submit(f"line {n}")
                sent.append(time.monotonic())
    assert route.call_count == 5
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert min(gaps) >= 0.1 * (1 + shared_budget.rules.GUARD) - 0.005, gaps


@pytest.mark.slow
def test_a_ceiling_is_not_starved_by_a_faster_client_without_one(redis: RedisServer) -> None:
    # Spacing a ceiling by the lane's last send from any process let a client with no ceiling,
    # sending all the time, keep it from ever sending: it is spaced by its own sends alone.
    base = "https://gateway.test"
    with respx.mock(base_url=base) as gateway:
        gateway.post("/beta/v1/images/generations").mock(return_value=beta_submitted("1"))
        unlimited = RateLimit(store=redis.url)
        ceiling = RateLimit(submits_per_second=10, store=redis.url)
        stop = threading.Event()
        with (
            Client(api_key=KEY, base_url=base, rate_limit=unlimited) as web,
            Client(api_key=KEY, base_url=base, rate_limit=ceiling) as batch,
        ):

            def flood() -> None:
                while not stop.is_set():
                    web.submit("busy")

            def lines() -> None:
                for n in range(5):
                    batch.submit(f"line {n}")

            flooding, spaced = threading.Thread(target=flood), threading.Thread(target=lines)
            flooding.start()
            spaced.start()
            try:
                spaced.join(timeout=4 * 0.1 * 10)  # four intervals, ten times over at most
                starved = spaced.is_alive()
            finally:
                stop.set()  # a starved one goes once the flood ends
                flooding.join()
                spaced.join()
    assert not starved


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_live_process_keeps_its_slots_past_their_lease_by_renewing_them(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # DESIGN 25: slots are leased for a few seconds, so a dead holder frees them soon
    # (``test_rate_store_bursts``); a live one renews them for as long as its request lasts.
    monkeypatch.setattr(shared_budget, "LEASE", 0.3)
    limit = RateLimit(store=redis.url)  # no ceiling: requests in flight are counted
    maker = Client if kind == "sync" else AsyncClient
    client = maker(api_key=KEY, base_url="https://gateway.test", rate_limit=limit)
    service: Any = client._flows.budget.service  # type: ignore[union-attr]
    with contextlib.closing(redis.client()) as store:
        flying = service.keys["submit"][1]  # the lane, then its requests in flight

        async def ask(name: str, *args: Any, **kwargs: Any) -> Any:
            answer = getattr(service, name)(*args, **kwargs)
            return await answer if kind == "async" else answer

        ticket, wait = await ask("reserve", "submit")
        assert wait == 0.0
        await anyio.sleep(1.0)  # three leases: renewed every 0.1 s meanwhile
        seconds, micros = store.time()
        assert store.zcount(flying, seconds + micros / 1e6, "+inf") == 1  # its lease holds
        await ask("finished", ticket, limited=False, retry_after=None, backoff=(0.5, 8.0))
        assert store.zcard(flying) == 0
    if kind == "async":
        await client.close()  # type: ignore[misc]
    else:
        client.close()


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_questions_for_a_full_window_sleep_until_a_place_frees_and_one_polls(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # DESIGN 25: no budget is busy-polled. A question for a place in a full window sleeps until
    # one of this process's requests ends; one of them asks again every two round trips, for
    # places other processes free (before: every waiter, every few milliseconds).
    monkeypatch.setattr(_rate_store, "HOLD", 60.0)  # no question is handed back meanwhile
    takes: list[str] = []  # the token of every question the store is asked
    real = shared_budget.take_steps

    def counted(limit: RateLimit, ticket: Any) -> Any:
        takes.append(ticket.token)
        return (yield from real(limit, ticket))

    monkeypatch.setattr(shared_budget, "take_steps", counted)
    limit = RateLimit(store=redis.url)  # no ceiling: a start window of four
    maker = Client if kind == "sync" else AsyncClient
    client = maker(api_key=KEY, base_url="https://gateway.test", rate_limit=limit)
    service: Any = client._flows.budget.service  # type: ignore[union-attr]
    ended = {"limited": False, "retry_after": None, "backoff": (0.5, 8.0)}

    async def ask(name: str, *args: Any, **kwargs: Any) -> Any:
        answer = getattr(service, name)(*args, **kwargs)
        return await answer if kind == "async" else answer

    async def until(done: Callable[[], bool]) -> None:
        with anyio.fail_after(10):
            while not done():
                await anyio.sleep(0.005)

    flying = [await ask("reserve", "submit") for _ in range(4)]
    assert [wait for _, wait in flying] == [0.0] * 4
    got: list[tuple[Any, float]] = []
    async with anyio.create_task_group() as group:

        async def waiter() -> None:
            if kind == "sync":
                got.append(await anyio.to_thread.run_sync(service.reserve, "submit"))
            else:
                got.append(await service.reserve("submit"))

        for _ in range(6):
            group.start_soon(waiter)
        await until(lambda: len(takes) >= 4 + 6 + 5)
        assert len(set(takes[10:15])) == 1  # asked again by one of the six only
        await ask("finished", flying[0][0], **ended)  # a place frees: one waiter has it
        await until(lambda: len(got) == 1)
        assert got[0][1] == 0.0
        for ticket, _ in [*flying[1:], got[0]]:
            await ask("finished", ticket, **ended)
        await until(lambda: len(got) == 6)
    assert [wait for _, wait in got] == [0.0] * 6
    for ticket, _ in got[1:]:
        await ask("finished", ticket, **ended)
    if kind == "async":
        await client.close()  # type: ignore[misc]
    else:
        client.close()


# ---------------------------------------------------------------------------- faults


@contextlib.contextmanager
def tcp_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A store that is not one: each connection is handed to ``handle``."""
    with tcp_listener(handle) as port:
        yield f"redis://127.0.0.1:{port}/0"


def silent(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(30)
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass  # reads every command, answers none


def garbage(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(30)
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                conn.sendall(b"*2\r\n$5\r\nhello\r\n$5\r\nworld\r\n")


def free_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{probe.getsockname()[1]}/0"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rate store" in r.getMessage()]


@pytest.mark.parametrize("store", ["unreachable", "silent", "garbage"])
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.slow
def test_a_store_that_fails_never_fails_a_request_and_warns_once(
    store: str,
    kind: str,
    served_gateway: tuple[MockGateway, str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not tried again during the test, however slowly it runs: each try of the store is one
    # connection to it, so counting them counts what the store cost.
    monkeypatch.setattr(_rate_store, "REJOIN_AFTER", 3600.0)
    gw, base = served_gateway
    connections: list[socket.socket] = []

    def counted(handle: Callable[[socket.socket], None]) -> Callable[[socket.socket], None]:
        return lambda conn: (connections.append(conn), handle(conn))[1]

    servers = {"silent": silent, "garbage": garbage}
    with contextlib.ExitStack() as stack:
        url = (
            free_port_url()
            if store == "unreachable"
            else stack.enter_context(tcp_server(counted(servers[store])))
        )
        limit = RateLimit(submits_per_second=4, store=url)
        began = time.monotonic()
        if kind == "sync":
            with Client(api_key=KEY, base_url=base, rate_limit=limit, timeout=0.5) as client:
                ids = [client.submit(f"p{i}").task_id for i in range(6)]
        else:

            async def submit_all() -> list[str]:
                async with AsyncClient(
                    api_key=KEY, base_url=base, rate_limit=limit, timeout=0.5
                ) as client:
                    return [(await client.submit(f"p{i}")).task_id for i in range(6)]

            ids = anyio.run(submit_all)
        took = time.monotonic() - began
    assert len(set(ids)) == 6
    assert gw.stats()["tasks_created"] == 6
    # Paced alone at the configured 4/s: 5 intervals of 0.25 s at least (a lower bound, which
    # no load can break; a gateway counting 429s in 1 s windows of its own clock was a
    # wall-clock window: a loaded machine bunched two requests). A store that never answers
    # cost one timeout (0.5 s), once: one connection, never a try per request.
    assert took >= 1.2, took
    assert len(connections) == (0 if store == "unreachable" else 1)
    (warning,) = warnings_of(caplog)
    assert "pace" in warning
    assert "alone" in warning
    assert "Traceback" not in caplog.text
    assert KEY not in caplog.text


@pytest.mark.redis
@pytest.mark.slow
def test_the_client_rejoins_the_store_when_it_answers_again(
    rejoin_soon: None, gateway_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisServer()  # not started: unreachable at first
    try:
        with Client(
            api_key=KEY,
            base_url=gateway_url,
            rate_limit=RateLimit(submits_per_second=50, store=store.url),
        ) as client:
            client.submit("while the store is away")
            store.start()
            time.sleep(0.3)  # past REJOIN_AFTER: the next request tries the store again
            client.submit("the store is back")
            assert any(k.endswith(b":submit") for k in store_values(store))
    finally:
        store.stop()
    lines = warnings_of(caplog)
    assert len(lines) == 2, lines
    assert "not usable (ConnectionError)" in lines[0]
    assert "answers again" in lines[1]


@pytest.mark.slow
def test_killing_the_store_mid_batch_loses_nothing_and_bills_nothing_twice(
    redis: RedisServer,
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw, base = served_gateway
    lines = 30
    source = tmp_path / "in.txt"
    source.write_text("".join(f"prompt {i}\n" for i in range(lines)))
    limit = RateLimit(submits_per_second=40, queries_per_second=200, store=redis.url)

    def kill_after_ten() -> None:
        while gw.stats()["tasks_created"] < 10:
            time.sleep(0.01)
        redis.stop()

    killer = threading.Thread(target=kill_after_ten)
    killer.start()
    report = run_batch(
        source,
        tmp_path / "out",
        gallery=False,
        client_factory=lambda: AsyncClient(api_key=KEY, base_url=base, rate_limit=limit),
    )
    killer.join(timeout=30)
    assert report.exit_code == 0
    assert report.counts == {"saved": lines}
    assert gw.stats()["tasks_created"] == lines  # each line billed once
    assert len(list((tmp_path / "out").glob("*.png"))) == lines
    assert len(warnings_of(caplog)) == 1
    assert "Traceback" not in caplog.text
    assert KEY not in caplog.text


# ---------------------------------------------------------------------------- the CLI


def test_cli_rate_store_from_the_environment_shares_the_budget(
    redis: RedisServer, gateway_url: str
) -> None:
    result = CliRunner().invoke(
        app,
        ["--json", "submit", "a fox", "--base-url", gateway_url, "--rate", "2"],
        env={"IMGGW_API_KEY": KEY, "IMGGW_RATE_STORE": redis.url},
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["task_id"] == "1"
    assert any(k.endswith(b":submit") for k in store_values(redis))


@pytest.mark.parametrize("url", ["http://cache:6379", "redis://cache:port/0"])
def test_cli_a_bad_rate_store_is_a_usage_error_and_nothing_is_sent(
    url: str, served_gateway: tuple[MockGateway, str]
) -> None:
    gw, base = served_gateway
    result = CliRunner().invoke(
        app,
        ["submit", "a fox", "--base-url", base, "--rate-store", url],
        env={"IMGGW_API_KEY": KEY},
    )
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --rate-store must be a redis://")
    assert gw.stats()["requests"] == {}
