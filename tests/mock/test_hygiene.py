"""The gateway under a long run and rude clients: memory bounded by the live window, links that
name the server's own origin, and slow sockets cut off."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from imggw_client.mock import MockGateway

from .helpers import KEY, beta_body, call, query, record, submit, task_id


@pytest.mark.slow
def test_tasks_and_keys_are_forgotten_past_their_ttl_so_memory_stays_bounded() -> None:
    gw = MockGateway(
        manual_clock=True, duration_min=1, duration_max=1, retention=30, idempotency_ttl=20
    )
    first = task_id(submit(gw, idem="key-0"))
    gw.advance(1)
    first_link = record(query(gw, first))["result"]["images"][0]["url"][0]
    seen = []
    for i in range(1, 10_000):
        submit(gw, idem=f"key-{i}")
        gw.advance(0.1)
        if i % 500 == 0:
            seen.append(gw.stats()["live"])
    peak = {kind: max(live[kind] for live in seen) for kind in ("tasks", "idempotency_keys")}
    # A task lives its duration, its retention and a minute's grace: 91 s, 910 submits;
    # a key lives 20 s, 200 submits.
    assert 900 <= peak["tasks"] <= 911
    assert 195 <= peak["idempotency_keys"] <= 201
    assert query(gw, first).status == 404  # forgotten, and its link with it
    assert call(gw, "GET", first_link.removeprefix("http://imggw.mock"), key=None).status == 404
    assert task_id(submit(gw, idem="key-0")) == "10001"  # the key is free again
    assert gw.stats()["tasks_created"] == 10_001


def test_a_task_past_its_retention_still_says_so_for_a_minute() -> None:
    gw = MockGateway(manual_clock=True, duration_min=1, duration_max=1, retention=30)
    tid = task_id(submit(gw))
    gw.advance(1 + 30 + 59)
    url = record(query(gw, tid))["result"]["images"][0]["url"][0]
    assert call(gw, "GET", url.removeprefix("http://imggw.mock"), key=None).status == 410
    gw.advance(2)
    assert query(gw, tid).status == 404


def test_result_links_name_the_socket_not_the_host_header() -> None:
    gw = MockGateway(duration_min=0, duration_max=0)
    auth = {"Authorization": f"Bearer {KEY}"}
    with gw.serve() as base, httpx.Client(base_url=base, headers=auth) as http:
        http.post("/beta/v1/images/generations", json=beta_body()).raise_for_status()
        for host in ("evil.example", "127.0.0.1:1", "x@evil.example"):
            answer = http.get("/beta/v1/tasks/1", headers={"Host": host})
            url = answer.json()["data"]["result"]["images"][0]["url"][0]
            assert url.startswith(f"{base}/results/"), url
            assert http.get(url).status_code == 200


def test_in_process_links_name_the_in_process_origin() -> None:
    gw = MockGateway(duration_min=0, duration_max=0)
    transport = gw.transport()
    with httpx.Client(transport=transport, base_url="http://somewhere.else") as http:
        auth = {"Authorization": f"Bearer {KEY}"}
        http.post("/beta/v1/images/generations", json=beta_body(), headers=auth)
        data = http.get("/beta/v1/tasks/1", headers=auth).json()["data"]
        assert data["result"]["images"][0]["url"][0].startswith("http://imggw.mock/results/")


# Without the gateway's own deadline (0.5 s below) uvicorn holds a connection that trickles
# its headers, or that never sends a byte, for ever: the server closing it at all proves the
# deadline. These bounds only stop a test that would otherwise wait for ever; they are 60 times
# the deadline, so no load makes them decide a result (no wall-clock window).
GIVE_UP_AFTER = 30.0


def _closed_while_trickling(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF or reset) while a byte went every 50 ms."""
    deadline = time.monotonic() + GIVE_UP_AFTER
    sock.settimeout(0.05)
    while time.monotonic() < deadline:
        try:
            sock.sendall(b"X")  # a header line trickling in, a byte at a time
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset, broken pipe: closed
            return True
    return False


@pytest.mark.slow
def test_a_client_trickling_its_headers_is_cut_off() -> None:
    gw = MockGateway(request_timeout=0.5)
    with gw.serve() as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            assert _closed_while_trickling(slow)
        with socket.create_connection(("127.0.0.1", port)) as idle:
            idle.settimeout(GIVE_UP_AFTER)
            assert idle.recv(1) == b""  # never sent a byte: closed too
        assert httpx.get(f"{base}/openapi.json").status_code == 200  # others are served


@pytest.mark.slow
def test_a_kept_alive_connection_gets_the_same_deadline_for_its_next_request() -> None:
    gw = MockGateway(request_timeout=0.5)
    with gw.serve() as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.settimeout(3)
            conn.sendall(b"GET /_mock/stats HTTP/1.1\r\nHost: x\r\n\r\n")
            head = conn.recv(65536)
            assert head.startswith(b"HTTP/1.1 200")
            conn.sendall(b"GET /_mock/stats HTTP/1.1\r\nHost: x\r\n")  # unfinished
            assert _closed_while_trickling(conn)
