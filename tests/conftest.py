"""Shared fixtures: both clients behind one awaitable face, a fake clock, canned bodies; and the
test lanes (a bare ``pytest`` runs the fast lane, ``pytest --all`` everything)."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import random
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import respx

from imggw_client import AsyncClient, Client, PollPolicy, RetryPolicy
from imggw_client.mock import MockGateway

from . import loopback
from .gateways import serve_options

# The fixtures users opt into (tests/mock uses them). Named here, not in tests/mock/conftest.py:
# pytest refuses `pytest_plugins` in a conftest it only finds while collecting.
pytest_plugins = ["imggw_client.mock.pytest_plugin"]

CANARY_KEY = "sk-canary-5e1f0c2b9a8d7e6f4a3b"
BASE_URL = "http://gateway.test"
CDN = "http://cdn.test"
# Signature, some bytes, and the IEND chunk a whole PNG ends with (downloads check for it).
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8 + b"\x00\x00\x00\x00IEND\xaeB`\x82"


# ---------------------------------------------------------------------------- hypothesis

# One result on any day: each property test draws the same examples every run (its seed comes
# from the test), keeps no example database between runs, and has no per-example deadline, which
# a loaded machine would fail and an idle one pass. `HYPOTHESIS_PROFILE=explore` draws anew, to
# hunt for examples the repeatable draw does not make (a find becomes an @example).
hypothesis.settings.register_profile("repeatable", derandomize=True, database=None, deadline=None)
hypothesis.settings.register_profile("explore", database=None, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


# ---------------------------------------------------------------------------- lanes

# Tests that start a service or take long run in a lane of their own (pyproject.toml registers
# the marks). A bare `pytest` runs only the tests of no lane, for day-to-day work; `--all` runs
# every lane (.ci/run does); selecting tests yourself (a path, -k, -m) runs what you selected.
LANES = ("slow", "browser", "redis", "dask")
# A test that takes one of these fixtures starts what the lane is named after: it gets the
# lane's mark from here, so a new test that takes the fixture is in the lane without saying so.
# A Dask run takes seconds on its cluster, and a local S3 server (moto) seconds to start.
FIXTURE_LANES = {
    "cluster": ("dask", "slow"),
    "redis_store": ("redis",),
    "browser": ("browser",),
    "s3": ("slow",),
}
LANE_DESELECTED = pytest.StashKey[int]()
# A test of the fast lane that takes longer than this on its own is named at the end of the
# run, to be marked slow: the lane stays fast as tests are added (named, never failed: how long
# a test takes depends on the machine's load).
FAST_LANE_BUDGET = 1.0
# Each test's seconds (setup, call and teardown), while the fast lane runs.
fast_lane_times: dict[str, float] | None = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gateway(**options): the options of the test's gateway (tests/gateways.py)"
    )
    # A shell starts a background job (`bash .ci/run &`) with SIGINT ignored, and an ignored
    # signal stays ignored through exec: every CLI process a test interrupts with Ctrl-C would
    # then finish unbothered (or never stop). A user's Ctrl-C reaches a normal process, so the
    # tests run as one: Python's own handler, which exec turns back into the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The fast lane's tests are timed here, not where they are collected: with pytest-xdist the
    # main process collects nothing, and only it sees every report and writes the summary.
    if not config.getoption("all_lanes") and not selected_by_hand(config):
        global fast_lane_times
        fast_lane_times = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        dest="all_lanes",
        help="run every test: the fast lane and the slow, browser, redis and dask lanes "
        "(a bare pytest runs the fast lane only)",
    )


def lanes_of(item: pytest.Item) -> list[str]:
    return [lane for lane in LANES if item.get_closest_marker(lane) is not None]


def selected_by_hand(config: pytest.Config) -> bool:
    """Whether the user chose the tests: a path or node id, ``-k`` or ``-m``."""
    return (
        config.args_source is pytest.Config.ArgsSource.ARGS
        or bool(config.getoption("keyword"))
        or bool(config.getoption("markexpr"))
    )


# First, so that `-m redis` (pytest's own selection, after this) sees the marks given here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, lanes in FIXTURE_LANES.items():
            for lane in lanes:
                if fixture in names and item.get_closest_marker(lane) is None:
                    item.add_marker(lane)
    if config.getoption("all_lanes") or selected_by_hand(config):
        return
    # Deselected, never skipped: the summary counts them apart from the tests that ran.
    fast = [item for item in items if not lanes_of(item)]
    laned = [item for item in items if lanes_of(item)]
    if laned:
        config.hook.pytest_deselected(items=laned)
        items[:] = fast
    config.stash[LANE_DESELECTED] = len(laned)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if fast_lane_times is not None:
        fast_lane_times[report.nodeid] = fast_lane_times.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.stash.get(LANE_DESELECTED, 0)
    if count:
        terminalreporter.write_line(
            f"fast lane: {count} tests of the {', '.join(LANES)} lanes deselected; "
            "`pytest --all` runs every test"
        )
    times = fast_lane_times or {}
    over = sorted((took, nodeid) for nodeid, took in times.items() if took > FAST_LANE_BUDGET)
    for took, nodeid in reversed(over):
        terminalreporter.write_line(
            f"fast lane: {nodeid} took {took:.1f} s, over the lane's {FAST_LANE_BUDGET:g} s a "
            "test: if it does on a quiet machine too, mark it @pytest.mark.slow"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    # The helpers that start a lane's service check that the test asking for it is in the lane.
    loopback.running_lanes = set(lanes_of(item))


def pytest_runtest_teardown(item: pytest.Item) -> None:
    loopback.running_lanes = None


# ---------------------------------------------------------------------------- servers


class _Switch:
    """An ASGI app that hands each request to the gateway of the test running now."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.app is None:  # between tests: a late request of the last one's
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


@pytest.fixture(scope="session")
def _shared_server() -> Iterator[tuple[_Switch, str]]:
    switch = _Switch()
    with loopback.serve_asgi(switch) as url:
        yield switch, url


@pytest.fixture
def shared_serve(_shared_server: tuple[_Switch, str]) -> Iterator[Callable[[Any], str]]:
    """Serves the test's gateway over a real loopback socket, on one uvicorn server that the
    session shares (starting and stopping one costs about 0.2 s a test); gives its base URL.

    Example::

        def test_it(shared_serve):
            url = shared_serve(MockGateway())
    """
    switch, url = _shared_server

    def serve(gateway: Any) -> str:
        switch.app = gateway.asgi()
        return url

    yield serve
    switch.app = None


# ---------------------------------------------------------------------------- gateways
# One family, named by what each gives: tests/gateways.py says which is which.


@pytest.fixture
def gateway_options() -> dict[str, Any]:
    """A folder's options for its ``gateway`` (a conftest overrides this); a ``gateway`` mark
    on the module or the test goes over them. None: MockGateway's own defaults."""
    return {}


def _marked_options(request: pytest.FixtureRequest, options: dict[str, Any]) -> dict[str, Any]:
    marked = dict(options)
    for mark in reversed(list(request.node.iter_markers("gateway"))):  # the closest last
        marked.update(mark.kwargs)
    return marked


@pytest.fixture
def make_gateway(
    request: pytest.FixtureRequest, gateway_options: dict[str, Any]
) -> Callable[..., MockGateway]:
    """``make_gateway(**options)``: a gateway in process with the folder's options, the
    ``gateway`` mark's, then ``options``; for a test that wants more than one, or decides its
    options as it runs."""
    marked = _marked_options(request, gateway_options)
    return lambda **options: MockGateway(**{**marked, **options})


@pytest.fixture
def gateway(make_gateway: Callable[..., MockGateway]) -> MockGateway:
    """The reference gateway in process, with the folder's options and the ``gateway`` mark's."""
    return make_gateway()


@pytest.fixture
def serve_gateway() -> Iterator[Callable[[MockGateway], str]]:
    """``serve_gateway(gateway)``: serves it on a loopback socket of its own until the test
    ends; gives its base URL."""
    with contextlib.ExitStack() as stack:
        yield lambda gateway: stack.enter_context(gateway.serve())


@pytest.fixture
def gateway_url(gateway: MockGateway, serve_gateway: Callable[[MockGateway], str]) -> str:
    """The URL of ``gateway``, served on a loopback socket of its own."""
    return serve_gateway(gateway)


@pytest.fixture
def shared_gateway_url(gateway: MockGateway, shared_serve: Callable[[Any], str]) -> str:
    """The URL of ``gateway``, served on the loopback server the session shares."""
    return shared_serve(gateway)


@pytest.fixture
def served_gateway(gateway: MockGateway, gateway_url: str) -> tuple[MockGateway, str]:
    """``(gateway, gateway_url)``: the gateway to look into, and where the client reaches it."""
    return gateway, gateway_url


@pytest.fixture
def gateway_process(
    request: pytest.FixtureRequest, gateway_options: dict[str, Any]
) -> Iterator[str]:
    """The URL of ``imggw mock serve`` in a process of its own, with the options ``gateway``
    would have; stopped with SIGINT when the test ends."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("IMGGW_")}
    options = serve_options(_marked_options(request, gateway_options))
    with loopback.mock_serve_process(options, {**env, "PYTHONUNBUFFERED": "1"}) as url:
        yield url


@pytest.fixture
def respx_gateway() -> Iterator[respx.MockRouter]:
    """A respx router that answers for the gateway at ``BASE_URL``: no gateway, no socket."""
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        yield router


@pytest.fixture
def redis_store() -> Iterator[loopback.RedisServer]:
    """A real ``redis-server`` on a free loopback port, killed after the test (the redis lane)."""
    with loopback.redis_server() as server:
        yield server


# ---------------------------------------------------------------------------- clients


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeTime:
    """A monotonic clock that only moves when the client sleeps; records every sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float, arm: object = None) -> None:
        """Sleeps whole: nothing else moves while fake time passes, so no wake could come."""
        assert seconds >= 0
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float, arm: object = None) -> None:
        self.sleep(seconds)


class Driven:
    """Either client, every method awaitable; on fake time when given a FakeTime."""

    def __init__(self, inner: Client | AsyncClient, fake: FakeTime | None = None) -> None:
        self.inner = inner
        inner._flows.rng = random.Random(1234)
        if fake is not None:
            self.fake = fake
            inner._sleep = fake.sleep if isinstance(inner, Client) else fake.asleep  # type: ignore[assignment]
            inner._flows.clock = fake.clock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return call


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


FAST_POLL = PollPolicy(initial_interval=1.0, max_interval=10.0, multiplier=1.5)


def make_client(kind: str, fake: FakeTime, **kwargs: Any) -> Driven:
    kwargs.setdefault("api_key", CANARY_KEY)
    kwargs.setdefault("base_url", BASE_URL)
    kwargs.setdefault("retry", RetryPolicy(max_attempts=4, initial_backoff=0.5, max_backoff=4.0))
    cls = Client if kind == "sync" else AsyncClient
    return Driven(cls(**kwargs), fake)


@pytest.fixture
async def client(kind: str, fake_time: FakeTime) -> AsyncIterator[Driven]:
    driven = make_client(kind, fake_time)
    yield driven
    await driven.close()


# ---------------------------------------------------------------------------- bodies


def beta_submitted(task_id: str = "42") -> httpx.Response:
    return httpx.Response(
        200, json={"code": 200, "data": [{"status": "submitted", "task_id": task_id}]}
    )


def alpha_submitted(task_id: str = "42") -> httpx.Response:
    return httpx.Response(200, json={"code": 200, "msg": "success", "data": {"taskId": task_id}})


def beta_task(task_id: str = "42", status: str = "processing", **data: Any) -> httpx.Response:
    return httpx.Response(
        200, json={"code": 200, "data": {"id": task_id, "status": status, **data}}
    )


def beta_done(task_id: str = "42", urls: list[str] | None = None) -> httpx.Response:
    urls = urls if urls is not None else [f"{CDN}/r/{task_id}.png"]
    return beta_task(
        task_id,
        "completed",
        progress=100,
        result={"images": [{"url": urls}]},
        cost=0.04,
        credits_cost=4,
    )


def alpha_task(task_id: str = "42", state: str = "generating", **data: Any) -> httpx.Response:
    return httpx.Response(
        200,
        json={"code": 200, "msg": "success", "data": {"taskId": task_id, "state": state, **data}},
    )


def alpha_done(task_id: str = "42", urls: list[str] | None = None) -> httpx.Response:
    urls = urls if urls is not None else [f"{CDN}/r/{task_id}.png"]
    return alpha_task(
        task_id,
        "success",
        progress=100,
        resultJson=json.dumps({"resultUrls": urls}),
        creditsConsumed="4",
    )


def beta_error(status: int, code: str, message: str = "refused", **headers: str) -> httpx.Response:
    return httpx.Response(
        status,
        json={"code": status, "error": {"code": code, "message": message}},
        headers={name.replace("_", "-"): value for name, value in headers.items()},
    )


def alpha_error(code: int, msg: str = "refused", http_status: int = 200) -> httpx.Response:
    return httpx.Response(http_status, json={"code": code, "msg": msg, "data": None})


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content)


@pytest.fixture(autouse=True)
def private_state(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line keeps a journal in the XDG state folder by default: each test (and each
    process it starts) gets a state folder of its own, never the user's, and no IMGGW_JOURNAL
    from the environment it runs in."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("IMGGW_JOURNAL", raising=False)
