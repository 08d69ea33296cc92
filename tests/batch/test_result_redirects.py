"""A batch line whose result link redirects into the machine (another port of loopback) fails
at once with ``redirect_refused``: not retried as a network fault until its deadline, nothing
sent where the redirect led, nothing saved, the task billed once (DESIGN 22)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from imggw_client import PollPolicy, RetryPolicy
from imggw_client.batch import run_batch
from imggw_client.mock import MockGateway, MockRequest, MockResponse

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}


def test_a_line_whose_link_redirects_to_loopback_fails_with_its_code(tmp_path: Path) -> None:
    with socket.socket() as other:  # a port of this machine that must never be asked
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        other.setblocking(False)
        port = other.getsockname()[1]
        gw = MockGateway(duration_min=0.01, duration_max=0.02, retry_after=0, latency=0.0)
        handle = gw.handle
        fetched: list[str] = []

        def redirecting(request: MockRequest) -> MockResponse:
            if request.method == "GET" and "/results/" in request.path:
                fetched.append(request.path)
                return MockResponse(302, b"", (("location", f"http://127.0.0.1:{port}/admin"),))
            return handle(request)

        gw.handle = redirecting  # type: ignore[method-assign]
        source = tmp_path / "in.jsonl"
        source.write_text(json.dumps({"prompt": "a cat"}) + "\n")
        out = tmp_path / "out"
        report = run_batch(
            source, out, client_factory=lambda: gw.async_client(**FAST), line_timeout=30
        )
        try:
            other.accept()
            asked = True
        except BlockingIOError:
            asked = False
    assert not asked  # the other port never saw a connection
    assert report.exit_code == 1
    rows: list[dict[str, Any]] = [json.loads(x) for x in report.manifest.read_text().splitlines()]
    assert rows[0]["status"] == "failed"
    assert rows[0]["error"]["code"] == "redirect_refused"
    assert f"http://127.0.0.1:{port}" in rows[0]["error"]["message"]
    assert len(fetched) == 1  # once: not retried as if the network had failed
    assert not list(out.glob("*.png"))
    assert gw.stats()["tasks_created"] == 1
