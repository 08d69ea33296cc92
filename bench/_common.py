"""Helpers shared by the benchmarks: a minimal gateway-shaped ASGI app, a uvicorn runner, and
interleaved timing so that SDK and baseline share the same machine conditions."""

from __future__ import annotations

import bisect
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SUBMIT_BODY = json.dumps({"code": 200, "data": [{"status": "submitted", "task_id": "42"}]}).encode()
TASK_BODY = json.dumps(
    {"code": 200, "data": {"id": "42", "status": "processing", "progress": 40}}
).encode()


def _headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


SUBMIT_HEADERS, TASK_HEADERS = _headers(SUBMIT_BODY), _headers(TASK_BODY)


async def fixed_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers a submit or a query of surface B with fixed JSON, as fast as ASGI allows."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    post = scope["method"] == "POST"
    body, headers = (SUBMIT_BODY, SUBMIT_HEADERS) if post else (TASK_BODY, TASK_HEADERS)
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serve(app: str) -> Iterator[str]:
    """Serves ``module:attr`` (a module under bench/) with uvicorn in a child process on
    127.0.0.1, so the server does not compete for the measuring process's GIL."""
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "_server.py"), app],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield base
    finally:
        child.terminate()
        child.wait(timeout=10)


def interleaved(
    contenders: dict[str, Callable[[], Any]], *, rounds: int, per_round: int
) -> dict[str, float]:
    """Median seconds per call of each contender, measured in alternating rounds."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():  # warm up connections, caches and imports
        for _ in range(per_round // 4 + 1):
            fn()
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            started = time.perf_counter()
            for _ in range(per_round):
                fn()
            samples[name].append((time.perf_counter() - started) / per_round)
    return {name: statistics.median(values) for name, values in samples.items()}


async def interleaved_async(
    contenders: dict[str, Callable[[], Any]], *, rounds: int, per_round: int
) -> dict[str, float]:
    """:func:`interleaved` for contenders that are coroutine functions."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():
        for _ in range(per_round // 4 + 1):
            await fn()
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            started = time.perf_counter()
            for _ in range(per_round):
                await fn()
            samples[name].append((time.perf_counter() - started) / per_round)
    return {name: statistics.median(values) for name, values in samples.items()}


@contextlib.contextmanager
def child_gateway(command: list[str]) -> Iterator[str]:
    """A gateway served by a child process (``command``), which prints its URL and serves until
    its stdin closes; yields the URL."""
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the gateway did not start (it said {url!r})")
        yield url
    finally:
        assert child.stdin is not None
        with contextlib.suppress(OSError):
            child.stdin.close()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def gateway_report(url: str) -> dict[str, Any]:
    """A child gateway's ``/_mock/stats`` and its ``/_bench/log`` of requests."""
    import httpx

    with httpx.Client(base_url=url, timeout=60) as http:
        return {"stats": http.get("/_mock/stats").json(), "log": http.get("/_bench/log").json()}


def peak_in_window(times: list[float], seconds: float) -> int:
    """The most requests in any window ``(t - seconds, t]``, as the gateway counts them."""
    times = sorted(times)
    return max(
        (j - bisect.bisect_right(times, t - seconds) + 1 for j, t in enumerate(times)), default=0
    )
