"""A result download follows redirects, but never one that leaves the link's origin for a
loopback, private or link-local host (DESIGN 22, "Names and links"), and a gateway's own
redirect is never followed: over real loopback servers, with both clients and with a caller's
httpx and httpx2 clients."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from imggw_client import (
    AsyncClient,
    Client,
    DownloadError,
    ImggwError,
    RetryPolicy,
    Task,
    TaskStatus,
)
from imggw_client._download import REDIRECT_REFUSED

from ..conftest import PNG, Driven, FakeTime
from ..loopback import serve_asgi

pytestmark = pytest.mark.anyio

RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.5, max_backoff=1.0)
Seen = list[str]


def app(routes: Callable[[str], tuple[int, dict[str, str]]], seen: Seen) -> Any:
    """An ASGI server that notes each path it is asked for and answers ``routes(path)``: a
    status and its headers, with a PNG for a 200."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"] + (
            "?" + scope["query_string"].decode() if scope["query_string"] else ""
        )
        seen.append(path)
        status, headers = routes(scope["path"])
        body = PNG if status == 200 else b""
        pairs = [(k.encode(), v.encode()) for k, v in headers.items()]
        pairs.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": pairs})
        await send({"type": "http.response.body", "body": body})

    return asgi


class Hosts:
    """A result host and another server on loopback, each with the paths it was asked for."""

    def __init__(self, results: str, other: str, results_seen: Seen, other_seen: Seen) -> None:
        self.results, self.other = results, other
        self.results_seen, self.other_seen = results_seen, other_seen
        self.other_port = int(other.rpartition(":")[2])

    def clear(self) -> None:
        self.results_seen.clear()
        self.other_seen.clear()


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    other_seen: Seen = []
    results_seen: Seen = []
    with serve_asgi(app(lambda path: (200, {"content-type": "image/png"}), other_seen)) as other:
        port = other.rpartition(":")[2]

        def routes(path: str) -> tuple[int, dict[str, str]]:
            if path == "/to-other.png":  # another port of this same machine
                return 302, {"location": f"{other}/admin/delete?all=1"}
            if path == "/to-localhost.png":
                return 307, {"location": f"http://localhost:{port}/admin/delete"}
            if path.startswith("/gw/"):  # a gateway that sends its requests elsewhere
                return 307, {"location": f"{other}/admin/delete"}
            if path == "/same.png":  # the same origin: followed
                return 301, {"location": "/final.png?Expires=1&Signature=s"}
            if path.startswith("/loop/"):
                return 302, {"location": f"/loop/{int(path[6:]) + 1}"}
            return 200, {"content-type": "image/png"}

        with serve_asgi(app(routes, results_seen)) as results:
            yield Hosts(results, other, results_seen, other_seen)


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def libraries() -> list[Any]:
    found: list[Any] = [httpx]
    if sys.version_info >= (3, 11):
        import httpx2

        found.append(httpx2)
    return found


@pytest.fixture(params=[None, *libraries()], ids=lambda lib: "own" if lib is None else lib.__name__)
def library(request: pytest.FixtureRequest) -> Any:
    return request.param


def task(url: str) -> Task:
    return Task(id="42", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[url])


def make(kind: str, library: Any, **http: Any) -> tuple[Driven, Any]:
    """An imggw client, on an HTTP client of ``library``'s when one is given (the caller's)."""
    own = None
    if library is not None:
        own = (library.Client if kind == "sync" else library.AsyncClient)(**http)
    cls = Client if kind == "sync" else AsyncClient
    options: dict[str, Any] = {"http_client": own} if own is not None else {}
    inner = cls(api_key="sk-redirects-0042", base_url="http://gateway.test", retry=RETRY, **options)
    return Driven(inner, FakeTime()), own  # retries wait on a fake clock


async def close(client: Driven, own: Any) -> None:
    await client.close()
    if own is not None:
        result = own.close() if hasattr(own, "close") else own.aclose()
        if hasattr(result, "__await__"):
            await result


@pytest.mark.parametrize("path", ["/to-other.png", "/to-localhost.png"])
async def test_a_redirect_into_the_machine_or_its_network_is_refused(
    hosts: Hosts, kind: str, library: Any, tmp_path: Path, path: str
) -> None:
    hosts.clear()
    client, own = make(kind, library)
    try:
        with pytest.raises(DownloadError) as refused:
            await client.download(task(f"{hosts.results}{path}"), tmp_path / "out")
    finally:
        await close(client, own)
    assert refused.value.code == REDIRECT_REFUSED
    target = hosts.other if path == "/to-other.png" else f"http://localhost:{hosts.other_port}"
    assert target in refused.value.message  # the host it was refused, never the link
    assert "admin" not in refused.value.message
    assert "?" not in refused.value.message
    assert hosts.results_seen == [path]  # asked once: not retried as a network fault
    assert hosts.other_seen == []  # the other server never heard of it
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


async def test_a_redirect_within_the_origin_is_followed(
    hosts: Hosts, kind: str, library: Any, tmp_path: Path
) -> None:
    hosts.clear()
    client, own = make(kind, library)
    try:
        files = await client.download(task(f"{hosts.results}/same.png"), tmp_path)
    finally:
        await close(client, own)
    assert files[0].path.read_bytes() == PNG
    assert hosts.results_seen == ["/same.png", "/final.png?Expires=1&Signature=s"]


async def test_redirects_end_at_the_http_clients_limit(
    hosts: Hosts, kind: str, tmp_path: Path
) -> None:
    hosts.clear()
    client, own = make(kind, httpx, max_redirects=2)
    try:
        with pytest.raises(DownloadError):
            await client.download(task(f"{hosts.results}/loop/0"), tmp_path)
    finally:
        await close(client, own)
    # Each of the three attempts sends the link and two redirects: as httpx itself counts.
    assert hosts.results_seen == ["/loop/0", "/loop/1", "/loop/2"] * 3


async def test_a_public_host_may_redirect_to_another_public_one_not_to_the_metadata_address(
    kind: str, tmp_path: Path
) -> None:
    client, own = make(kind, None)
    try:
        with respx.mock(assert_all_called=False) as web:
            web.get("https://cdn.example/r/1.png").mock(
                return_value=httpx.Response(
                    302, headers={"location": "https://bucket.s3.example/1.png?X-Amz-Signature=9"}
                )
            )
            web.get("https://bucket.s3.example/1.png").mock(
                return_value=httpx.Response(200, content=PNG, headers={"content-type": "image/png"})
            )
            web.get("https://cdn.example/r/2.png").mock(
                return_value=httpx.Response(
                    302, headers={"location": "http://169.254.169.254/latest/meta-data/"}
                )
            )
            metadata = web.get(url__startswith="http://169.254.169.254/").mock(
                return_value=httpx.Response(200, content=PNG)
            )
            files = await client.download(task("https://cdn.example/r/1.png"), tmp_path)
            assert files[0].path.read_bytes() == PNG
            with pytest.raises(DownloadError) as refused:
                await client.download(task("https://cdn.example/r/2.png"), tmp_path / "2")
    finally:
        await close(client, own)
    assert refused.value.code == REDIRECT_REFUSED
    assert "http://169.254.169.254:80, a link-local host" in refused.value.message
    assert not metadata.called


@pytest.mark.parametrize("follow", [False, True])
async def test_a_gateways_redirect_is_never_followed_whatever_the_http_client_says(
    hosts: Hosts, kind: str, library: Any, follow: bool
) -> None:
    # A caller's client built with follow_redirects=True must not carry a paid submit, or a
    # query with the key, to wherever a gateway's 307 points (here: another port on loopback).
    hosts.clear()
    own = None
    if library is not None:
        own = (library.Client if kind == "sync" else library.AsyncClient)(follow_redirects=follow)
    options: dict[str, Any] = {"http_client": own} if own is not None else {}
    cls = Client if kind == "sync" else AsyncClient
    inner = cls(api_key="sk-redirects-0042", base_url=f"{hosts.results}/gw", retry=RETRY, **options)
    client = Driven(inner, FakeTime())
    try:
        with pytest.raises(ImggwError) as refused:
            await client.submit("a fox")
    finally:
        await close(client, own)
    assert hosts.other_seen == []  # the other server never heard of it
    assert hosts.results_seen
    assert all(seen == "/gw/beta/v1/images/generations" for seen in hosts.results_seen)
    assert f"a redirect to '{hosts.other}/admin/delete', never followed" in str(refused.value)
    assert "sk-redirects-0042" not in str(refused.value)
