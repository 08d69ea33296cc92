"""A client used before ``fork()`` (gunicorn ``--preload``, a ``multiprocessing`` pool after a
first call) is safe in both processes (DESIGN 18): the child sets the inherited connections
aside (never closing them, never using them) and makes its own, the parent keeps its own.
Forked after a real request over a loopback socket on a keep-alive connection; then parent and
child submit at once, and a stdlib gateway tells which connection each request came on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from imggw_client import AsyncClient, Client, ConfigurationError, RetryPolicy

KEY = "test-key-0123456789"
QUICK_RETRY = RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.05)

# Seconds a test: forked processes over real sockets (the slow lane, tests/conftest.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only"),
]


class Gateway:
    """Just enough of surface beta over HTTP/1.1 keep-alive: a new task id per idempotency
    key, tasks that stay running. Each request is recorded with the client port it came from.
    While ``together`` is set, a submit is answered only once that many submits are in (or the
    barrier gives up, which only a broken client makes it do)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[int, str, str, str | None]] = []  # port, method, path, key
        self.ids: dict[str, str] = {}
        self.together: threading.Barrier | None = None

    def submit(self, port: int, path: str, key: str | None) -> str:
        with self.lock:
            self.seen.append((port, "POST", path, key))
            task_id = self.ids.setdefault(key or "", str(100 + len(self.ids)))
        if self.together is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                self.together.wait(timeout=20)
        return task_id

    def query(self, port: int, path: str) -> str:
        with self.lock:
            self.seen.append((port, "GET", path, None))
        return path.rsplit("/", 1)[1]

    def ports_of(self, key: str) -> list[int]:
        with self.lock:
            return [port for port, method, _, k in self.seen if method == "POST" and k == key]

    def queries_of(self, task_id: str) -> list[int]:
        with self.lock:
            return [
                p
                for p, method, path, _ in self.seen
                if method == "GET" and path.endswith(f"/{task_id}")
            ]


def handler(gw: Gateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a connection serves request after request

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            port = self.client_address[1]
            task_id = gw.submit(port, self.path, self.headers.get("Idempotency-Key"))
            self.reply({"code": 200, "data": [{"status": "submitted", "task_id": task_id}]})

        def do_GET(self) -> None:
            task_id = gw.query(self.client_address[1], self.path)
            self.reply({"code": 200, "data": {"id": task_id, "status": "processing"}})

        def reply(self, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


# Not the shared family (tests/gateways.py): a plain threading server of our own, whose state a
# forked child and its parent reach over the same socket, whatever the child inherited.
@pytest.fixture
def gateway() -> Iterator[tuple[Gateway, str]]:
    gw = Gateway()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(gw))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield gw, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def fork(child: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """Forks; the child runs ``child`` and sends back what it returns (or the error it
    raised), then ends without returning into pytest. Returns, in the parent, a function that
    waits for the child and gives its answer."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns on fork() in a process with threads (the gateway's): the child
        # runs only the client's code, then _exit.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - measured in the child, not reported
        status = 1
        try:
            os.close(read)
            try:
                answer = child()
                status = 0
            except BaseException as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write, json.dumps(answer).encode())
        finally:
            os._exit(status)
    os.close(write)

    def collect() -> dict[str, Any]:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        answer: dict[str, Any] = json.loads(data or b"{}")
        answer["exit"] = os.waitstatus_to_exitcode(status)
        return answer

    return collect


def check_both(gw: Gateway, warm_port: int, parent: dict[str, Any], child: dict[str, Any]) -> None:
    assert child["exit"] == 0, child
    # Each process got its own task: the one the gateway made for its own key.
    assert parent["task_id"] != child["task_id"]
    assert gw.ids[parent["key"]] == parent["task_id"]
    assert gw.ids[child["key"]] == child["task_id"]
    # Two submits, from two connections: the parent's kept one, and the child's own.
    (parent_port,) = gw.ports_of(parent["key"])
    (child_port,) = gw.ports_of(child["key"])
    assert parent_port == warm_port  # the parent still uses the connection it had
    assert child_port != warm_port
    # Later calls work in both, each on its own connection; the child closed its client
    # before the parent's later call, which still went over the parent's connection.
    assert child["later"] == child["task_id"]
    assert gw.queries_of(child["task_id"]) == [child_port]
    assert parent["later"] == parent["task_id"]
    assert gw.queries_of(parent["task_id"]) == [warm_port]


def test_a_client_used_before_fork_works_in_parent_and_child_on_connections_of_their_own(
    gateway: tuple[Gateway, str],
) -> None:
    gw, url = gateway
    with Client(api_key=KEY, base_url=url, retry=QUICK_RETRY) as client:
        warm = client.submit("before the fork")  # a keep-alive connection, now idle in the pool
        (warm_port,) = gw.ports_of(warm.idempotency_key)
        gw.together = threading.Barrier(2)  # the two submits below are in flight at once

        def in_child() -> dict[str, Any]:
            sub = client.submit("in the child")
            later = client.get(sub.task_id)
            client.close()  # closes the child's own connections only
            return {"task_id": sub.task_id, "key": sub.idempotency_key, "later": later.id}

        child = fork(in_child)
        sub = client.submit("in the parent")
        answer = child()  # the child has closed its client and ended
        later = client.get(sub.task_id)
    parent = {"task_id": sub.task_id, "key": sub.idempotency_key, "later": later.id}
    check_both(gw, warm_port, parent, answer)


def test_an_async_client_used_before_fork_works_in_parent_and_child(
    gateway: tuple[Gateway, str],
) -> None:
    """Forked inside the parent's running event loop: the child starts a loop of its own
    (``asyncio.run``), the parent goes on in its loop, on its connection."""
    gw, url = gateway

    async def main() -> tuple[int, dict[str, Any], dict[str, Any]]:
        async with AsyncClient(api_key=KEY, base_url=url, retry=QUICK_RETRY) as client:
            warm = await client.submit("before the fork")
            (warm_port,) = gw.ports_of(warm.idempotency_key)
            gw.together = threading.Barrier(2)

            async def child_work() -> dict[str, Any]:
                sub = await client.submit("in the child")
                later = await client.get(sub.task_id)
                await client.close()
                return {"task_id": sub.task_id, "key": sub.idempotency_key, "later": later.id}

            child = fork(lambda: asyncio.run(child_work()))
            sub = await client.submit("in the parent")
            answer = await asyncio.get_running_loop().run_in_executor(None, child)
            later = await client.get(sub.task_id)
        parent = {"task_id": sub.task_id, "key": sub.idempotency_key, "later": later.id}
        return warm_port, parent, answer

    warm_port, parent, answer = asyncio.run(main())
    check_both(gw, warm_port, parent, answer)


def test_a_client_never_used_before_fork_keeps_its_http_client_in_the_child(
    gateway: tuple[Gateway, str],
) -> None:
    gw, url = gateway
    with httpx.Client() as http, Client(api_key=KEY, base_url=url, http_client=http) as client:

        def in_child() -> dict[str, Any]:
            sub = client.submit("in the child")
            return {"task_id": sub.task_id, "key": sub.idempotency_key}

        answer = fork(in_child)()
        assert answer["exit"] == 0, answer
        assert gw.ids[answer["key"]] == answer["task_id"]
        assert client.submit("in the parent").task_id != answer["task_id"]


def test_a_callers_http_client_used_before_fork_is_refused_in_the_child_before_sending(
    gateway: tuple[Gateway, str],
) -> None:
    """Its connections cannot be made again by the SDK (the caller's settings), and sharing
    them would mix the two processes' requests: a clear error, nothing sent; the parent goes
    on."""
    gw, url = gateway
    with httpx.Client() as http, Client(api_key=KEY, base_url=url, http_client=http) as client:
        client.submit("before the fork")

        def in_child() -> dict[str, Any]:
            try:
                client.submit("in the child")
            except ConfigurationError as err:
                return {"refused": str(err)}
            return {"refused": None}

        answer = fork(in_child)()
        assert answer["exit"] == 0, answer
        assert "forked" in answer["refused"]
        assert "http_client" in answer["refused"]
        assert len(gw.seen) == 1  # the child sent nothing
        assert client.get(client.submit("in the parent").task_id).status.value == "running"


_POOL_CLIENT: Client | None = None  # what a pool's workers inherit, as a module-level client


def submit_in_worker(prompt: str) -> tuple[int, str, str]:
    assert _POOL_CLIENT is not None
    sub = _POOL_CLIENT.submit(prompt)
    return os.getpid(), sub.task_id, sub.idempotency_key


def test_a_multiprocessing_pool_made_after_a_first_call_gives_each_worker_its_connection(
    gateway: tuple[Gateway, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, url = gateway
    with Client(api_key=KEY, base_url=url, retry=QUICK_RETRY) as client:
        monkeypatch.setattr(f"{__name__}._POOL_CLIENT", client)
        warm = client.submit("before the pool")
        (warm_port,) = gw.ports_of(warm.idempotency_key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork() beside threads
            pool = multiprocessing.get_context("fork").Pool(2)
        with pool:
            done = pool.map(submit_in_worker, [f"line {n}" for n in range(6)], chunksize=1)
        later = client.get(client.submit("after the pool").task_id)
    assert len({task_id for _, task_id, _ in done}) == 6
    for pid, task_id, key in done:
        assert pid != os.getpid()
        assert gw.ids[key] == task_id
        (port,) = gw.ports_of(key)
        assert port != warm_port  # never the connection the parent made before the fork
    assert gw.queries_of(later.id) == [warm_port]  # and the parent's is still its own
