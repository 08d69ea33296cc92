"""Real loopback servers for integration tests: any ASGI app under uvicorn, and a raw TCP server."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from imggw_client.mock._asgi import serve_app

# Any ASGI app on 127.0.0.1, the same way the reference gateway is served.
serve_asgi = serve_app


async def asgi_body(receive: Callable[[], Any]) -> bytes:
    """An ASGI request's whole body, read message by message."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


@contextlib.contextmanager
def dropping_server(answer: Callable[[int], bytes | None]) -> Iterator[str]:
    """A TCP server on 127.0.0.1: for the n-th connection, reads the request and writes
    ``answer(n)``, or drops the connection without a byte when it is None."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        count = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            if stop.is_set():  # woken to stop
                conn.close()
                break
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    body += conn.recv(65536)
                count += 1
                reply = answer(count)
                if reply is not None:
                    conn.sendall(reply)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        _stop(listener, stop, thread)


def http_json(status: int, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


Handler = Callable[[socket.socket, int, bytes], None]


@contextlib.contextmanager
def tcp_listener(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP listener on 127.0.0.1 that hands each connection to ``handle`` in a thread of its
    own; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            if stop.is_set():  # woken to stop
                conn.close()
                break
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        _stop(listener, stop, thread)


def _stop(listener: socket.socket, stop: threading.Event, thread: threading.Thread) -> None:
    """Stops an accept loop at once: a connection of our own wakes it, rather than waiting
    out its accept timeout (a fifth of a second in every test that serves)."""
    stop.set()
    with contextlib.suppress(OSError), socket.create_connection(listener.getsockname(), 1):
        pass
    thread.join(timeout=5)
    listener.close()


@contextlib.contextmanager
def raw_server(handle: Handler) -> Iterator[str]:
    """A hostile HTTP/1.1 server on 127.0.0.1: each connection gets its own thread, which reads
    one request head and calls ``handle(conn, n, head)`` for the n-th request; ``handle``
    writes whatever it likes (slowly, cut short, endlessly) and the connection is then closed."""
    count = iter(range(1, 1 << 30))

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                handle(conn, next(count), data.partition(b"\r\n\r\n")[0])
            except OSError:
                pass  # the client gave up on us: that is the point of most of these tests

    with tcp_listener(serve) as port:
        yield f"http://127.0.0.1:{port}"


def drip(
    conn: socket.socket, data: bytes, every: float, stop: threading.Event | None = None
) -> bool:
    """Sends ``data`` a byte at a time, ``every`` seconds apart: each read sees a byte well
    within any read timeout, so only a deadline on the whole request ends it. True when every
    byte went out: a client that gave up first makes a send fail (OSError) or ``stop`` is set."""
    import time

    for index, byte in enumerate(data):
        pause = every if index else 0.0
        if stop is not None and stop.wait(pause):
            return False
        if stop is None:
            time.sleep(pause)
        conn.sendall(bytes([byte]))
    return True


@contextlib.contextmanager
def mock_serve_process(options: list[str], env: dict[str, str]) -> Iterator[str]:
    """``imggw mock serve --port 0 OPTIONS`` in its own process; yields its URL and stops it
    with SIGINT (as Ctrl-C would) on the way out."""
    import signal
    import subprocess
    import sys

    server = subprocess.Popen(
        [sys.executable, "-m", "imggw_cli", "mock", "serve", "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), server.stderr.read() if server.stderr else ""
    try:
        yield url
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)


REDIS_SERVER = os.environ.get("IMGGW_REDIS_SERVER", "/usr/bin/redis-server")

# The lanes of the test running now (set by tests/conftest.py; None outside a test).
running_lanes: set[str] | None = None


def require_lane(lane: str, what: str) -> None:
    """Fails a test that starts ``what`` without being in ``lane``: the fast lane must never
    need the service, and `pytest -m LANE` must find every test that does."""
    if running_lanes is not None and lane not in running_lanes:
        raise RuntimeError(
            f"this test starts {what}, so it belongs in the {lane} lane: mark it "
            f"@pytest.mark.{lane} (or take the fixture that gives the mark, tests/conftest.py)"
        )


class RedisServer:
    """A real ``redis-server`` (Debian's package; ``.ci/run`` installs it) on a free loopback
    port, with nothing saved to disk. ``stop()`` kills it as a crash would; ``start()`` brings
    it back on the same port, empty."""

    def __init__(self) -> None:
        import os

        if not os.access(REDIS_SERVER, os.X_OK):
            raise RuntimeError(
                f"redis-server not found at {REDIS_SERVER}: install it with `apt-get install -y "
                "redis-server` (.ci/run does), or point IMGGW_REDIS_SERVER at one"
            )
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: Any = None

    def start(self) -> None:
        import subprocess
        import time

        require_lane("redis", "a redis-server")
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url)


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    """A running :class:`RedisServer`, killed on the way out."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
