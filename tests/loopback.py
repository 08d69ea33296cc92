"""Real loopback servers for integration tests: any ASGI app under uvicorn, and a raw TCP server."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

from imggw_client.mock._asgi import serve_app

# Any ASGI app on 127.0.0.1, the same way the reference gateway is served.
serve_asgi = serve_app


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
        stop.set()
        thread.join(timeout=5)
        listener.close()


def http_json(status: int, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
