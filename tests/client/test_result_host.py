"""Errors from a result host (DESIGN 23): the host that serves a result's link, often not the
gateway's, is named as ``scheme://host:port`` when it cannot be reached or sends a broken
file; never "the gateway", never the link's path or query (a signed link's signature is
there). Both clients, over a real loopback socket; retries on the fake clock."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from imggw_client import DownloadError, Task, TaskStatus
from imggw_client._core.text import link_origin

from ..conftest import PNG, Driven, FakeTime
from ..loopback import raw_server
from .test_reprs_hide_links import LINKS, SECRET, pieces

pytestmark = pytest.mark.anyio

SIGNATURE = "c2lnbmVkLWxpbmstc2VjcmV0"
QUERY = f"Expires=1999999999&Signature={SIGNATURE}"


def result(url: str) -> Task:
    return Task(id="42", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[url])


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses every connection: bound (no one else can take it),
    never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def shows_nothing_of_the_link(err: BaseException) -> None:
    """Neither the error nor what it was raised from holds the link's path or query."""
    for shown in (str(err), repr(err), str(err.__cause__), repr(err.__cause__)):
        for secret in (SIGNATURE, "Signature", "Expires", "/results/", "42.png"):
            assert secret not in shown, (secret, shown)
        assert "gateway" not in shown, shown


async def test_a_result_host_that_refuses_the_connection_is_named_not_the_gateway(
    client: Driven, fake_time: FakeTime, closed_port: int, tmp_path: Path
) -> None:
    link = f"http://127.0.0.1:{closed_port}/results/42.png?{QUERY}"
    with pytest.raises(DownloadError) as raised:
        await client.download(result(link), tmp_path / "out")
    err = raised.value
    assert type(err) is DownloadError  # what users catch, as before
    assert (
        str(err)
        == err.message
        == (
            f"could not download result 42-0 of task 42: could not talk to the result host "
            f"http://127.0.0.1:{closed_port} (ConnectError)"
        )
    )
    assert str(err.__cause__) == (
        f"could not talk to the result host http://127.0.0.1:{closed_port} (ConnectError)"
    )
    shows_nothing_of_the_link(err)
    assert len(fake_time.slept) == 3  # four attempts (the client's RetryPolicy), then the error
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


async def test_reading_from_a_refusing_result_host_names_it_too(
    client: Driven, closed_port: int
) -> None:
    link = f"http://127.0.0.1:{closed_port}/results/42.png?{QUERY}"
    with pytest.raises(DownloadError) as raised:
        await client.read(result(link))
    assert str(raised.value) == (
        f"could not download result 42-0 of task 42: could not talk to the result host "
        f"http://127.0.0.1:{closed_port} (ConnectError)"
    )
    shows_nothing_of_the_link(raised.value)


async def test_a_result_host_that_cuts_the_file_short_is_named_not_the_gateway(
    client: Driven, tmp_path: Path
) -> None:
    served: list[bytes] = []

    def cut_short(conn: socket.socket, number: int, head: bytes) -> None:
        served.append(head.split(b"\r\n")[0])
        # No length declared, and the image ends before its end marker: a dropped connection.
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n" + PNG[:300]
        )

    with raw_server(cut_short) as host, pytest.raises(DownloadError) as raised:
        await client.download(result(f"{host}/results/42.png?{QUERY}"), tmp_path)
    assert str(raised.value) == (
        f"could not download result 42-0 of task 42: the result host {host} sent a response "
        "that could not be understood (the file was cut short)"
    )
    shows_nothing_of_the_link(raised.value)
    assert served == [f"GET /results/42.png?{QUERY} HTTP/1.1".encode()] * 4  # every attempt


def test_a_links_host_is_its_scheme_host_and_port_and_nothing_else() -> None:
    assert [link_origin(link) for link in LINKS] == ["https://cdn.example:443"] * len(LINKS)
    for piece in pieces(SECRET):
        assert not any(piece in link_origin(link) for link in LINKS)
    assert link_origin("http://cdn.example:8080/r/1.png?Signature=x") == "http://cdn.example:8080"
    assert link_origin("http://cdn.example/r/1.png") == "http://cdn.example:80"
    assert link_origin("http://[::1]/r/1.png") == "http://[::1]:80"
    assert link_origin("https://[::1]:8443/r/1.png?k=v") == "https://[::1]:8443"
    assert link_origin("/results/1.png?Signature=x") == "?"
