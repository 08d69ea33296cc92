"""The options an openai-python user expects (DESIGN 21): ``with_options`` with every setting,
``default_headers`` and ``extra_headers``, ``timeout`` as an ``httpx.Timeout``, and the wait's
deadline named ``wait_timeout`` (``timeout=`` on a wait still works, with a warning). Against
the reference gateway over a real loopback socket; the gateway's side records every request's
headers as they arrived."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import respx

import imggw_client
from imggw_client import (
    AsyncClient,
    Client,
    ConfigurationError,
    PollPolicy,
    RateLimit,
    RequestValidationError,
    RetryPolicy,
    WaitTimeoutError,
)
from imggw_client._core.config import whole_request
from imggw_client.mock import MockGateway
from imggw_client.mock._gateway import fingerprint

from ..conftest import BASE_URL, Driven, beta_submitted, beta_task, make_client

KEY = "test-key"
OTHER_KEY = "other-key-0123"
FAST = PollPolicy(initial_interval=0.02, max_interval=0.05)
OURS = f"imggw-python/{imggw_client.__version__}"
Head = tuple[str, str, list[tuple[str, str]]]  # method, path, headers in the order sent


pytestmark = pytest.mark.gateway(api_keys=[KEY, OTHER_KEY], duration_min=0.05, duration_max=0.1)


class Recording:
    """The reference gateway, with the head of every request it is sent (results included)."""

    def __init__(self, gateway: MockGateway) -> None:
        self.gateway = gateway
        self.heads: list[Head] = []

    def asgi(self) -> Any:
        app = self.gateway.asgi()

        async def record(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                pairs = [
                    (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]
                ]
                self.heads.append((scope["method"], scope["path"], pairs))
            await app(scope, receive, send)

        return record

    def values(self, name: str, path_part: str = "") -> list[list[str]]:
        """For each request whose path holds ``path_part``: the values of header ``name``."""
        return [
            [v for k, v in pairs if k == name.lower()]
            for _, path, pairs in self.heads
            if path_part in path
        ]


@pytest.fixture
def recording(gateway: MockGateway) -> Recording:
    return Recording(gateway)


@pytest.fixture
def url(recording: Recording, shared_serve: Callable[[Any], str]) -> str:
    return shared_serve(recording)


async def using(kind: str, url: str, act: Callable[[Any], Any], **options: Any) -> Any:
    """``act(client)`` on a fresh client of ``kind`` (its result awaited if need be)."""
    options = {"api_key": KEY, "base_url": url, "poll": FAST, **options}
    if kind == "sync":
        with Client(**options) as client:
            return await anyio.to_thread.run_sync(lambda: act(client))
    async with AsyncClient(**options) as aclient:
        return await act(aclient)


# ---------------------------------------------------------------------------- headers


@pytest.mark.anyio
async def test_default_and_extra_headers_go_on_every_request_of_their_calls_never_on_results(
    kind: str, url: str, recording: Recording, tmp_path: Path
) -> None:
    async def act_async(client: AsyncClient) -> None:
        task = await client.generate("a fox", extra_headers={"X-Call": "gen"})
        await client.get(task.id, extra_headers={"X-Call": "get"})
        await client.download(task, tmp_path)

    def act_sync(client: Client) -> None:
        task = client.generate("a fox", extra_headers={"X-Call": "gen"})
        client.get(task.id, extra_headers={"X-Call": "get"})
        client.download(task, tmp_path)

    await using(
        kind,
        url,
        act_sync if kind == "sync" else act_async,
        default_headers={"X-Tenant": "acme", "X-Call": "default"},
    )
    api = [
        (method, path, pairs)
        for method, path, pairs in recording.heads
        if not path.startswith("/results/")
    ]
    assert [m for m, _, _ in api][:2] == ["POST", "GET"]  # the submit, then the wait's queries
    for _, path, pairs in api:
        names = [k for k, _ in pairs]
        assert dict(pairs)["x-tenant"] == "acme", path
        assert names.count("x-call") == 1, path  # the call's value replaces the default's
        assert names.count("authorization") == 1  # one key, ours
        assert names.count("user-agent") == 1
    calls = [dict(pairs)["x-call"] for _, _, pairs in api]
    assert calls == ["gen"] * (len(api) - 1) + ["get"]  # submit and every query of the wait
    results = [pairs for _, path, pairs in recording.heads if path.startswith("/results/")]
    assert results, "the download reached the gateway's result links"
    for pairs in results:  # another host in real life: neither the key nor the caller's headers
        assert {k for k, _ in pairs}.isdisjoint({"x-tenant", "x-call", "authorization"})


@pytest.mark.anyio
async def test_submit_and_wait_send_extra_headers_on_their_own_requests_only(
    kind: str, url: str, recording: Recording
) -> None:
    async def act_async(client: AsyncClient) -> None:
        sub = await client.submit("a fox", extra_headers={"X-Step": "submit"})
        await client.wait(sub, extra_headers={"X-Step": "wait"})
        await client.get(sub.task_id)

    def act_sync(client: Client) -> None:
        sub = client.submit("a fox", extra_headers={"X-Step": "submit"})
        client.wait(sub, extra_headers={"X-Step": "wait"})
        client.get(sub.task_id)

    await using(kind, url, act_sync if kind == "sync" else act_async)
    steps = recording.values("x-step")
    assert steps[0] == ["submit"]
    assert steps[1:-1]
    assert all(step == ["wait"] for step in steps[1:-1])
    assert steps[-1] == []  # a later call without them sends none


def test_a_callers_user_agent_leads_ours(url: str, recording: Recording) -> None:
    with Client(api_key=KEY, base_url=url, default_headers={"user-agent": "my-app/3"}) as client:
        sub = client.submit("a fox")
        client.get(sub.task_id, extra_headers={"User-Agent": "my-job/7"})
    assert recording.values("user-agent") == [[f"my-app/3 {OURS}"], [f"my-job/7 {OURS}"]]


def test_accept_and_user_agent_go_once_over_a_callers_client_and_its_defaults(
    url: str, recording: Recording
) -> None:
    theirs = httpx.Client(headers={"Accept": "text/html", "User-Agent": "their-app/2"})
    with Client(api_key=KEY, base_url=url, http_client=theirs) as client:
        sub = client.submit("a fox")
        client.get(sub.task_id, extra_headers={"accept": "application/problem+json"})
        with client.with_options(default_headers={"ACCEPT": "*/*"}) as other:
            other.get(sub.task_id)
    theirs.close()
    assert recording.values("accept") == [
        ["application/json"],  # ours over the client's default
        ["application/problem+json"],  # a call's own, in any case, over ours
        ["*/*"],  # a client's default_headers too
    ]
    assert recording.values("user-agent") == [[f"their-app/2 {OURS}"]] * 3
    assert recording.values("authorization") == [[f"Bearer {KEY}"]] * 3


def test_a_client_class_that_builds_its_own_requests_still_has_the_last_word(
    url: str, recording: Recording
) -> None:
    seen: list[dict[str, str]] = []

    class Stamping(httpx.Client):
        def build_request(self, *args: Any, **kwargs: Any) -> httpx.Request:
            seen.append({k.lower(): v for k, v in kwargs["headers"].items()})
            request = super().build_request(*args, **kwargs)
            request.headers["User-Agent"] = "corp-stamp/1"
            request.headers["Accept"] = "application/vnd.corp+json"
            return request

    with Stamping() as theirs, Client(api_key=KEY, base_url=url, http_client=theirs) as client:
        client.get(client.submit("a fox").task_id)
    assert [(h["accept"], h["user-agent"]) for h in seen] == [("application/json", OURS)] * 2
    assert recording.values("user-agent") == [["corp-stamp/1"]] * 2
    assert recording.values("accept") == [["application/vnd.corp+json"]] * 2


@pytest.mark.parametrize(
    "name", ["Authorization", "authorization", "Idempotency-Key", "IDEMPOTENCY-KEY"]
)
def test_no_header_of_the_callers_replaces_the_key_or_the_idempotency_key(
    name: str, url: str, gateway: MockGateway
) -> None:
    secret = "Bearer sk-their-own-9f8e7d"
    with pytest.raises(ConfigurationError) as made:
        Client(api_key=KEY, base_url=url, default_headers={name: secret})
    assert made.value.code == "invalid_headers"
    client = Client(api_key=KEY, base_url=url)
    with pytest.raises(ConfigurationError):
        client.with_options(default_headers={name: secret})
    calls: list[Callable[[], object]] = [
        lambda: client.submit("a fox", extra_headers={name: secret}),
        lambda: client.generate("a fox", extra_headers={name: secret}),
        lambda: client.get("1", extra_headers={name: secret}),
        lambda: client.wait("1", extra_headers={name: secret}),
    ]
    for call in calls:
        with pytest.raises(RequestValidationError) as refused:
            call()
        assert refused.value.field == "extra_headers"
        assert name in str(refused.value)  # names the header and what to pass instead
        assert "sk-their" not in str(refused.value)
        assert "sk-their" not in repr(refused.value)
    client.close()
    assert gateway.stats()["requests"] == {}  # refused before anything was sent


@pytest.mark.parametrize(
    "headers",
    [
        {"X-A": "one\r\nX-Injected: yes"},
        {"X A": "1"},
        {"X-A": 7},
        {"": "1"},
        {"X-A": "é"},
        {"Content-Length": "2"},
        {"transfer-encoding": "chunked"},
        {"Host": "elsewhere"},
        {"Content-Type": "text/plain"},
    ],
)
def test_a_header_that_could_split_or_alter_a_request_is_refused_before_sending(
    headers: dict[str, Any], gateway: MockGateway, url: str
) -> None:
    with pytest.raises(ConfigurationError):
        Client(api_key=KEY, base_url=url, default_headers=headers)
    with Client(api_key=KEY, base_url=url) as client, pytest.raises(RequestValidationError):
        client.submit("a fox", extra_headers=headers)
    assert gateway.stats()["requests"] == {}


def test_the_clients_default_headers_are_shown_without_letting_them_be_changed_in_place() -> None:
    client = Client(api_key=KEY, base_url=BASE_URL, default_headers={"X-Tenant": "acme"})
    shown = client.default_headers
    shown["X-Tenant"] = "mallory"
    assert client.default_headers == {"X-Tenant": "acme"}
    copy = client.with_options(default_headers={"x-tenant": "globex", "X-Team": "ml"})
    assert copy.default_headers == {"x-tenant": "globex", "X-Team": "ml"}  # added, replaced
    assert client.default_headers == {"X-Tenant": "acme"}
    assert "acme" not in repr(client._settings)  # a header's value may be a secret
    client.close()


# ---------------------------------------------------------------------------- with_options


@pytest.mark.anyio
async def test_with_options_takes_every_setting_and_changes_only_the_copy(
    kind: str, url: str, recording: Recording, gateway: MockGateway
) -> None:
    cls = Client if kind == "sync" else AsyncClient
    client = cls(api_key=KEY, base_url=url, poll=FAST)
    copy = client.with_options(
        surface="alpha",
        default_headers={"X-Team": "ml"},
        timeout=httpx.Timeout(12, connect=3),
        max_retries=1,
        poll=PollPolicy(initial_interval=0.03, max_interval=0.06),
    )
    assert (copy.surface, copy.default_headers, copy.retry.max_attempts) == (
        "alpha",
        {"X-Team": "ml"},
        2,
    )
    assert copy.timeout == httpx.Timeout(12, connect=3)
    assert copy.poll.initial_interval == 0.03
    assert (client.surface, client.default_headers, client.timeout) == ("beta", {}, 30.0)
    assert copy.with_options(retry=RetryPolicy(max_attempts=9)).retry.max_attempts == 9
    sub = copy.submit("a fox")
    sub = await sub if kind == "async" else sub
    assert sub.surface == "alpha"
    method, path, pairs = recording.heads[-1]
    assert (method, path.startswith("/alpha/"), dict(pairs)["x-team"]) == ("POST", True, "ml")
    if kind == "async":
        await copy.close()
        await client.close()
    else:
        copy.close()
        client.close()


@pytest.mark.anyio
async def test_a_copy_with_another_key_sends_that_key_and_keeps_its_own_budget_and_learning(
    kind: str, url: str, recording: Recording, gateway: MockGateway
) -> None:
    cls = Client if kind == "sync" else AsyncClient
    client = cls(api_key=KEY, base_url=url, poll=FAST, rate_limit=RateLimit(submits_per_second=5))
    mine = client.key_fingerprint  # worked out and kept on the original
    same = client.with_options(api_key=KEY, timeout=5)
    other = client.with_options(api_key=OTHER_KEY)
    # The same key at the same gateway: one budget and one memory of durations, as before.
    assert same._flows.budget is client._flows.budget
    assert same._flows.durations is client._flows.durations
    # Another key: the gateway limits and times it apart, so the copy does too.
    assert other._flows.budget is not client._flows.budget
    assert other._flows.durations is not client._flows.durations
    assert other.rate_limit == client.rate_limit  # the same settings, a budget of its own
    assert other.key_fingerprint != mine  # never the original's, kept from before
    assert other._http is client._http  # one connection pool still
    sub = other.submit("a fox")
    sub = await sub if kind == "async" else sub
    _, _, pairs = recording.heads[-1]
    assert dict(pairs)["authorization"] == f"Bearer {OTHER_KEY}"
    assert list(gateway.stats()["billing"]) == [fingerprint(OTHER_KEY)]  # the other account
    for copy in (same, other, client):
        closing = copy.close()
        if kind == "async":
            await closing
    assert client.is_closed
    assert other.is_closed


def test_a_copy_for_another_gateway_talks_to_it_alone_and_shares_the_journal(
    tmp_path: Path,
    url: str,
    gateway: MockGateway,
    make_gateway: Callable[..., MockGateway],
    serve_gateway: Callable[[MockGateway], str],
) -> None:
    second = make_gateway(api_keys=[KEY])
    second_url = serve_gateway(second)
    with Client(api_key=KEY, base_url=url, poll=FAST, journal=tmp_path / "j.sqlite") as client:
        there = client.with_options(base_url=second_url + "/")
        assert there.base_url == second_url
        assert there._flows.budget is not client._flows.budget
        assert there._flows.durations is not client._flows.durations
        assert there.journal is client.journal
        sub = there.submit("a fox")
        assert (gateway.stats()["tasks_created"], second.stats()["tasks_created"]) == (0, 1)
        entries = client.journal.tasks()  # type: ignore[union-attr]
        assert [e.task_id for e in entries] == [sub.task_id]
        # Its rows are the other gateway's: the original's own view does not count them.
        assert client.journal.tasks(scope=client.journal_scope) == []  # type: ignore[union-attr]
        assert [e.task_id for e in client.journal.tasks(scope=there.journal_scope)] == [  # type: ignore[union-attr]
            sub.task_id
        ]
        there.close()


@pytest.mark.parametrize(
    "changes",
    [
        {"api_key": "has space"},
        {"api_key": ""},
        {"base_url": "ftp://x"},
        {"base_url": "http://user:pw@host"},
        {"surface": "gamma"},
        {"default_headers": {"Authorization": "x"}},
        {"default_headers": ["X-A"]},
        {"timeout": httpx.Timeout(None)},
        {"timeout": httpx.Timeout(5, read=None)},
        {"timeout": "5"},
    ],
)
def test_with_options_checks_the_new_settings_as_the_client_does(changes: dict[str, Any]) -> None:
    client = Client(api_key=KEY, base_url=BASE_URL)
    with pytest.raises(ConfigurationError) as refused:
        client.with_options(**changes)
    assert "pw" not in str(refused.value)
    client.close()


# ---------------------------------------------------------------------------- timeouts


class Seen(httpx.BaseTransport):
    """A transport that answers every request as the gateway would and keeps the request."""

    def __init__(self, gateway: MockGateway) -> None:
        self.inner = gateway.transport()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.inner.handle_request(request)


@pytest.mark.gateway(api_keys=[KEY])
def test_an_httpx_timeout_bounds_each_phase_and_its_largest_limit_the_whole_request(
    gateway: MockGateway,
) -> None:
    seen = Seen(gateway)
    limits = httpx.Timeout(5, connect=2)
    with Client(
        api_key=KEY, base_url=BASE_URL, timeout=limits, transport=seen, poll=FAST
    ) as client:
        assert client.timeout == limits
        assert client._settings.timeout == 5.0  # the whole request's bound, as timeout=5
        assert whole_request(client.timeout) == 5.0  # read from the public timeout alike
        client.submit("a fox")
        assert seen.requests[-1].extensions["timeout"] == {
            "connect": 2.0,
            "read": 5.0,
            "write": 5.0,
            "pool": 5.0,
        }
        quick = client.with_options(timeout=httpx.Timeout(10, connect=1, read=0.5))
        assert quick._settings.timeout == whole_request(quick.timeout) == 10.0
        quick.submit("a fox")
        assert seen.requests[-1].extensions["timeout"] == {
            "connect": 1.0,
            "read": 0.5,
            "write": 10.0,
            "pool": 10.0,
        }
        plain = client.with_options(timeout=3)
        assert whole_request(plain.timeout) == 3.0
        plain.submit("a fox")
        assert seen.requests[-1].extensions["timeout"] == dict.fromkeys(
            ("connect", "read", "write", "pool"), 3.0
        )


@pytest.mark.parametrize("bad", [httpx.Timeout(None), httpx.Timeout(5, pool=None), 0, -1, True])
def test_a_timeout_that_would_let_a_request_hang_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigurationError):
        Client(api_key=KEY, base_url=BASE_URL, timeout=bad)


# ---------------------------------------------------------------------------- wait_timeout


@pytest.mark.anyio
async def test_wait_timeout_is_the_waits_deadline_whatever_the_request_timeout(
    kind: str, fake_time: Any, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post("/beta/v1/images/generations").mock(return_value=beta_submitted())
    respx_gateway.get("/beta/v1/tasks/42").mock(return_value=beta_task())  # running for ever
    client = make_client(kind, fake_time)
    quick = Driven(client.inner.with_options(timeout=1), fake_time)
    start = fake_time.now
    with pytest.raises(WaitTimeoutError) as info:
        await quick.wait("42", wait_timeout=7)
    assert fake_time.now - start == pytest.approx(7)  # its own deadline, not the 1 s request limit
    assert info.value.timeout == 7
    with pytest.raises(WaitTimeoutError):
        await quick.generate("a fox", wait_timeout=4)
    await client.close()


# A manual clock: tasks finish only when the test says so.
@pytest.mark.gateway(api_keys=[KEY], duration_min=5, duration_max=5, manual_clock=True)
def test_timeout_on_a_wait_still_works_with_a_deprecation_warning_at_the_callers_line(
    gateway: MockGateway,
) -> None:
    with gateway.client(poll=FAST) as client:
        sub = client.submit("a fox")
        with (
            pytest.warns(DeprecationWarning, match="wait_timeout") as caught,
            pytest.raises(WaitTimeoutError) as info,
        ):
            client.wait(sub, timeout=0)  # still the wait's deadline: one query, then out
        assert info.value.timeout == 0
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name]
        gateway.advance(10)
        with pytest.warns(DeprecationWarning, match="wait_timeout"):
            assert client.wait(sub, timeout=30).status == "succeeded"
        with (
            pytest.warns(DeprecationWarning, match="wait_timeout") as caught,
            pytest.raises(WaitTimeoutError),
        ):
            client.generate("a fox", timeout=0)
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name]


@pytest.mark.anyio
@pytest.mark.gateway(api_keys=[KEY])
async def test_async_timeout_on_a_wait_warns_at_the_callers_line_too(
    gateway: MockGateway,
) -> None:
    async with gateway.async_client(poll=FAST) as client:
        sub = await client.submit("a fox")
        with pytest.warns(DeprecationWarning, match="wait_timeout") as caught:
            await client.wait(sub, timeout=30)
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name]


@pytest.mark.anyio
async def test_wait_timeout_and_a_different_deprecated_timeout_together_are_refused(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RequestValidationError) as both:
            await client.wait("42", wait_timeout=10, timeout=20)
        assert both.value.field == "timeout"
        with pytest.raises(RequestValidationError):
            await client.generate("a fox", wait_timeout=10, timeout=20)  # before the paid submit
    with pytest.raises(RequestValidationError) as bad:
        await client.wait("42", wait_timeout=-1)
    assert bad.value.field == "wait_timeout"
    assert len(respx_gateway.calls) == 0


def test_a_copy_for_another_gateway_or_key_tells_that_gateways_silence_not_this_ones() -> None:
    """A batch's "no answer from the gateway" warning reads the client's silence: one gateway
    down must not be told of another's run."""
    client = Client(api_key=KEY, base_url=BASE_URL)
    same = client.with_options(timeout=5)
    client._silence.asked(0.0)  # a request to this gateway, unanswered
    assert same._silence.silent_for(100.0) == 100.0
    for other in (
        client.with_options(base_url="http://127.0.0.1:9"),
        client.with_options(api_key="sk-another-key-5b1c"),
    ):
        assert other._silence.silent_for(100.0) == 0.0
    client.close()
