"""A caller's own httpx2 client (DESIGN 23): httpx's continuation, with httpx's API and classes
of its own, as openai-python 3 hands its users. End to end over loopback with both clients,
the same imggw errors as an httpx client meets, and a clear error for a client of the wrong
kind."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client import (
    APIConnectionError,
    APITimeoutError,
    AsyncClient,
    Client,
    ConfigurationError,
    PollPolicy,
    RetryPolicy,
    TaskStatus,
)
from imggw_client.mock import MockGateway

from ..conftest import Driven
from ..loopback import tcp_listener

if sys.version_info >= (3, 11):
    import httpx2

KEY = "sk-httpx2-canary-4d7e1b"
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.version_info < (3, 11), reason="httpx2 needs Python 3.11 or newer"),
    pytest.mark.gateway(api_keys=[KEY], duration_min=0.02, duration_max=0.1),
]

FAST = {
    "retry": RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.02),
    "poll": PollPolicy(initial_interval=0.01, max_interval=0.05),
}


def their_client(kind: str, library: Any, seen: list[Any] | None = None, **options: Any) -> Any:
    """The HTTP client a caller of that library makes, of the kind the imggw client takes;
    every request it sends is added to ``seen``."""
    log = seen if seen is not None else []
    if kind == "sync":
        return library.Client(event_hooks={"request": [log.append]}, **options)

    async def note(request: Any) -> None:
        log.append(request)

    return library.AsyncClient(event_hooks={"request": [note]}, **options)


async def shut(http: Any) -> None:
    """Closes a caller's own client, as its caller would (imggw never closes it)."""
    if isinstance(http, httpx2.AsyncClient | httpx.AsyncClient):
        await http.aclose()
    else:
        http.close()


def imggw(kind: str, http: Any, base_url: str, **options: Any) -> Driven:
    make = Client if kind == "sync" else AsyncClient
    return Driven(make(api_key=KEY, base_url=base_url, http_client=http, **FAST, **options))


@pytest.fixture
def refused() -> str:
    """A loopback URL nothing listens on: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def mute() -> Iterator[str]:
    """A loopback server that takes every connection and never answers."""

    def hold(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            while conn.recv(65536):
                pass

    with tcp_listener(hold) as port:
        yield f"http://127.0.0.1:{port}"


async def test_submit_wait_and_download_through_an_httpx2_client(
    kind: str, gateway: MockGateway, shared_gateway_url: str, tmp_path: Path
) -> None:
    mock, url = gateway, shared_gateway_url
    seen: list[Any] = []
    http = their_client(kind, httpx2, seen, headers={"User-Agent": "my-app/3"})
    client = imggw(kind, http, url)
    sub = await client.submit("a lighthouse at dusk", aspect_ratio="16:9")
    task = await client.wait(sub, wait_timeout=30)
    assert task.status is TaskStatus.SUCCEEDED
    files = await client.download(task, tmp_path)
    assert [f.path.read_bytes()[:8] for f in files] == [b"\x89PNG\r\n\x1a\n"]
    assert files[0].sha256 == hashlib.sha256(files[0].path.read_bytes()).hexdigest()
    assert mock.stats()["tasks_created"] == 1
    # Their application's name stays first in what the gateway sees; the key went on the
    # request, never on their client.
    assert all(isinstance(r, httpx2.Request) for r in seen)
    assert {r.headers["user-agent"].split(" ")[0] for r in seen} == {"my-app/3"}
    assert {r.url.path.startswith("/beta/") for r in seen} == {True, False}  # and the result
    assert "authorization" not in {name.lower() for name in http.headers}
    await client.close()
    assert not http.is_closed  # theirs to close
    await shut(http)


async def test_httpx2s_own_user_agent_is_replaced_by_ours(
    kind: str, gateway: MockGateway, shared_gateway_url: str
) -> None:
    _, url = gateway, shared_gateway_url
    seen: list[Any] = []
    http = their_client(kind, httpx2, seen)
    client = imggw(kind, http, url)
    await client.submit("a fox")
    assert [r.headers["user-agent"].split("/")[0] for r in seen] == ["imggw-python"]
    await client.close()
    await shut(http)


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
async def test_a_refused_connection_is_the_same_error_from_either_library(
    kind: str, library: str, refused: str
) -> None:
    http = their_client(kind, httpx if library == "httpx" else httpx2)
    client = imggw(kind, http, refused)
    with pytest.raises(APIConnectionError) as caught:
        await client.submit("a fox")
    assert type(caught.value) is APIConnectionError
    # Nothing left, so nothing was sent: no key to keep, no bill to fear.
    assert caught.value.request_sent is False
    await client.close()
    await shut(http)


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
async def test_a_gateway_that_never_answers_is_a_timeout_from_either_library(
    kind: str, library: str, mute: str
) -> None:
    http = their_client(kind, httpx if library == "httpx" else httpx2)
    client = imggw(kind, http, mute, timeout=0.2)
    with pytest.raises(APITimeoutError):
        await client.get("123")
    await client.close()
    await shut(http)


async def test_an_httpx2_timeout_bounds_each_phase(kind: str, mute: str) -> None:
    http = their_client(kind, httpx2)
    client = imggw(kind, http, mute, timeout=httpx2.Timeout(5, read=0.2))
    assert isinstance(client.inner.timeout, httpx2.Timeout)
    with pytest.raises(APITimeoutError):
        await client.get("123")
    await client.close()
    await shut(http)


@pytest.mark.parametrize(
    ("make", "given"),
    [
        (Client, lambda: httpx2.AsyncClient()),
        (AsyncClient, lambda: httpx2.Client()),
        (Client, lambda: httpx.AsyncClient()),
        (AsyncClient, lambda: object()),
    ],
    ids=["sync-given-httpx2-async", "async-given-httpx2-sync", "sync-given-httpx-async", "object"],
)
def test_a_client_of_the_wrong_kind_is_a_clear_error(make: Any, given: Any) -> None:
    http = given()
    with pytest.raises(ConfigurationError) as caught:
        make(api_key=KEY, base_url="http://127.0.0.1:9", http_client=http)
    kind = make.__name__
    given_name = f"{type(http).__module__}.{type(http).__qualname__}"
    assert str(caught.value) == (
        f"http_client must be an httpx.{kind} or an httpx2.{kind}, not {given_name}"
    )


@pytest.mark.skipif(
    sys.modules["httpx"] is sys.modules.get("httpx2"),
    reason="under httpx2.alias_httpx() httpx's transports are httpx2's",
)
def test_an_httpx2_transport_is_refused_naming_where_it_goes() -> None:
    with pytest.raises(ConfigurationError, match=r"http_client=httpx2\.Client\(transport=") as e:
        Client(api_key=KEY, base_url="http://127.0.0.1:9", transport=httpx2.HTTPTransport())
    assert "transport must be an httpx.BaseTransport" in str(e.value)


def test_the_sdk_imports_httpx2_only_for_those_who_use_it() -> None:
    code = (
        "import sys\n"
        "from imggw_client import Client\n"
        "from imggw_client.mock import MockGateway\n"
        "gateway = MockGateway(api_keys=['k'])\n"
        "with Client(api_key='k', base_url='http://in-process',"
        " transport=gateway.transport()) as client:\n"
        "    client.submit('a fox')\n"
        "print('httpx2' in sys.modules)\n"
    )
    # Without the httpx2 lane's PYTHONPATH, whose start-up imports httpx2 on purpose.
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert done.stdout.strip() == "False", done.stderr
