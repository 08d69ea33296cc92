"""The CLI names itself in every request, over a real socket, and closes the HTTP clients it
makes when the command ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client import __version__
from imggw_client.mock import MockGateway
from imggw_client.mock._asgi import serve_app

from .helpers import imggw

AGENT = f"imggw-cli/{__version__} imggw-python/{__version__}"


class AgentRecorder:
    """An ASGI middleware that notes the User-Agent of every request the gateway receives."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.seen.append((scope["path"], headers.get(b"user-agent", b"").decode("latin-1")))
        await self.app(scope, receive, send)


@pytest.fixture
def recorded(gateway: MockGateway) -> Iterator[tuple[AgentRecorder, str]]:
    recorder = AgentRecorder(gateway.asgi())
    with serve_app(recorder) as url:
        yield recorder, url


def test_generate_names_the_cli_in_every_request(
    recorded: tuple[AgentRecorder, str], tmp_path: Path
) -> None:
    recorder, url = recorded
    run = imggw("generate", "a cat", "--base-url", url, "-o", str(tmp_path), "-q")
    assert run.code == 0, run.err
    paths = [path for path, _ in recorder.seen]
    assert any(p.startswith("/beta/v1/images") for p in paths)  # the submit
    assert any(p.startswith("/beta/v1/tasks/") for p in paths)  # the queries
    assert len(paths) >= 3  # and the download
    assert {agent for _, agent in recorder.seen} == {AGENT}


def test_batch_names_the_cli_in_every_request(
    recorded: tuple[AgentRecorder, str], tmp_path: Path
) -> None:
    recorder, url = recorded
    source = tmp_path / "in.txt"
    source.write_text("a cat\na dog\n")
    run = imggw("batch", str(source), "-o", str(tmp_path / "out"), "--base-url", url, "-q")
    assert run.code == 0, run.err
    assert len(recorder.seen) >= 6  # two submits, queries, two downloads
    assert {agent for _, agent in recorder.seen} == {AGENT}


@pytest.fixture
def http_clients(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Client | httpx.AsyncClient]:
    """Every httpx client made while the test runs."""
    made: list[httpx.Client | httpx.AsyncClient] = []

    class Client(httpx.Client):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    class AsyncClient(httpx.AsyncClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(httpx, "Client", Client)
    monkeypatch.setattr(httpx, "AsyncClient", AsyncClient)
    return made


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["submit", "a cat", "--mock"], 0),
        (["status", "1", "--mock"], 1),  # an error (no such task) ends the command too
        (["batch", "{source}", "-o", "{out}", "--mock", "-q"], 0),
    ],
)
def test_the_http_clients_are_closed_when_the_command_ends(
    http_clients: list[httpx.Client | httpx.AsyncClient],
    tmp_path: Path,
    args: list[str],
    code: int,
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a cat\n")
    run = imggw(*(a.format(source=source, out=tmp_path / "out") for a in args))
    assert run.code == code, run.err
    assert len(http_clients) == 1
    assert http_clients[0].is_closed
    assert http_clients[0].headers["user-agent"] == f"imggw-cli/{__version__}"
