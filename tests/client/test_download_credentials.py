"""A result download carries none of the credentials a caller's HTTP client holds for the
gateway (DESIGN 4: "Downloads never send the API key"): not an ``Authorization``,
``Proxy-Authorization`` or ``Cookie`` header set on the client, not its ``auth=``, whether the
client is httpx's, httpx2's or made by ``make_http_client``; on the link's request and on each
redirect's. A result host may be anyone's CDN. Both clients, over a real loopback socket; the
headers the result host receives are asserted exactly."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client import AsyncClient, Client, RetryPolicy, Task, TaskStatus
from imggw_client._transport import USER_AGENT

from ..conftest import PNG, Driven, FakeTime
from ..loopback import serve_asgi

pytestmark = pytest.mark.anyio

KEY = "sk-credentials-7c1e9a4b2d"
# What every download request carries, and nothing else: no credentials.
SENT = {"host", "accept", "accept-encoding", "connection", "user-agent"}
# The link's own request, and one redirect's (on its own origin, where httpx would keep an
# Authorization header and send its jar's cookies again).
PATHS = {"first": ["/first.png"], "redirect": ["/hop.png", "/final.png"]}

Heard = list[tuple[str, list[tuple[str, str]]]]


def result_host(heard: Heard) -> Any:
    """An ASGI result host that notes each request's path and every header it came with."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        heard.append((scope["path"], headers))
        if scope["path"] == "/hop.png":
            status, body, pairs = 302, b"", [(b"location", b"/final.png")]
        elif scope["path"] == "/hop-with-cookie.png":  # the host's own cookie, for its next hop
            status, body = 302, b""
            pairs = [(b"location", b"/final.png"), (b"set-cookie", b"edge=its-own-too; Path=/")]
        else:
            status, body, pairs = 200, PNG, [(b"content-type", b"image/png")]
        pairs.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": pairs})
        await send({"type": "http.response.body", "body": body})

    return asgi


@pytest.fixture(scope="module")
def host() -> Iterator[tuple[str, Heard]]:
    heard: Heard = []
    with serve_asgi(result_host(heard)) as url:
        yield url, heard


def libraries() -> list[Any]:
    found: list[Any] = [httpx]
    if sys.version_info >= (3, 11):
        import httpx2

        found.append(httpx2)
    return found


def with_headers(library: Any, kind: str) -> Any:
    headers = {
        "Authorization": f"Bearer {KEY}",
        "Proxy-Authorization": f"Basic {KEY}",
        "Cookie": f"session={KEY}",
    }
    return (library.Client if kind == "sync" else library.AsyncClient)(headers=headers)


def with_auth(library: Any, kind: str) -> Any:
    auth = library.BasicAuth("user", KEY)
    return (library.Client if kind == "sync" else library.AsyncClient)(auth=auth)


def made(library: Any, kind: str) -> Any:
    cls = Client if kind == "sync" else AsyncClient
    return cls.make_http_client(headers={"Authorization": f"Bearer {KEY}", "Cookie": f"s={KEY}"})


WAYS: list[Any] = [
    *(
        pytest.param(way, library, id=f"{way.__name__}-{library.__name__}")
        for library in libraries()
        for way in (with_headers, with_auth)
    ),
    pytest.param(made, httpx, id="make_http_client"),
]


async def download(kind: str, http: Any, url: str, dest: Path) -> None:
    cls = Client if kind == "sync" else AsyncClient
    inner = cls(
        api_key=KEY,
        base_url="http://gateway.test",
        http_client=http,
        retry=RetryPolicy(max_attempts=1),
    )
    client = Driven(inner, FakeTime())
    task = Task(id="42", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[url])
    try:
        files = await client.download(task, dest)
    finally:
        await client.close()
        closing = http.close() if kind == "sync" else http.aclose()
        if closing is not None:
            await closing
    assert files[0].path.read_bytes() == PNG


@pytest.mark.parametrize("hops", list(PATHS))
@pytest.mark.parametrize(("way", "library"), WAYS)
async def test_a_download_carries_none_of_the_http_clients_credentials(
    host: tuple[str, Heard],
    kind: str,
    way: Callable[[Any, str], Any],
    library: Any,
    hops: str,
    tmp_path: Path,
) -> None:
    url, heard = host
    heard.clear()
    await download(kind, way(library, kind), url + PATHS[hops][0], tmp_path)
    assert [path for path, _ in heard] == PATHS[hops]
    for _, headers in heard:
        assert sorted(name for name, _ in headers) == sorted(SENT)  # each once, no other
        assert dict(headers)["user-agent"] == USER_AGENT
        assert KEY not in repr(headers)


@pytest.mark.parametrize("link", ["/first.png", "/hop-with-cookie.png"])
async def test_only_cookies_the_jar_scopes_to_the_result_hosts_domain_go_there(
    host: tuple[str, Heard], kind: str, link: str, tmp_path: Path
) -> None:
    # A cookie with no domain the jar sends to every host: never to a result host. One scoped
    # to the result host's own domain is that host's, and goes; one of another domain never. A
    # cookie the result host sets on its redirect goes with the redirect's request.
    url, heard = host
    heard.clear()
    cookies = httpx.Cookies({"session": KEY})
    cookies.set("gateway", KEY, domain="gateway.test")
    cookies.set("cdn", "its-own", domain="127.0.0.1")
    http = (httpx.Client if kind == "sync" else httpx.AsyncClient)(cookies=cookies)
    await download(kind, http, url + link, tmp_path)
    expected = [(link, {"cdn=its-own"})]
    if link == "/hop-with-cookie.png":
        expected.append(("/final.png", {"cdn=its-own", "edge=its-own-too"}))
    received = [(path, set(dict(headers)["cookie"].split("; "))) for path, headers in heard]
    assert received == expected
    for _, headers in heard:
        assert sorted(name for name, _ in headers) == sorted({*SENT, "cookie"})
