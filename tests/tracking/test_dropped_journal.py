"""A client made with ``journal=<path>`` and dropped unclosed (a web application's client per
request or per tenant) leaves nothing running: its journal's lease renewer ends and its files
close once the journal is collected, as a dropped client's HTTP connections do."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import anyio

from imggw_client import AsyncClient, Client

from ..journals import FAST, KEY


def renewers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "imggw-journal-leases"}


def open_files(path: Path) -> int:
    """This process's descriptors open on the journal's files (the WAL's included)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with_target = os.path.join("/proc/self/fd", fd)
        try:
            target = os.readlink(with_target)
        except OSError:
            continue
        count += target.startswith(str(path))
    return count


def settled(before: set[threading.Thread], path: Path) -> tuple[set[threading.Thread], int]:
    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        left = renewers() - before
        if (not left and not open_files(path)) or time.monotonic() > deadline:
            return left, open_files(path)
        time.sleep(0.02)


def test_a_dropped_client_stops_its_journals_lease_renewer(
    shared_gateway_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "j.sqlite"
    before = renewers()
    for i in range(5):
        client = Client(KEY, shared_gateway_url, poll=FAST, journal=path)
        client.submit(f"a fox {i}")  # its row leased to this process, renewed while it lives
        assert renewers() - before
        del client
    assert settled(before, path) == (set(), 0)


def test_a_dropped_async_client_stops_its_journals_lease_renewer(
    shared_gateway_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "j.sqlite"
    before = renewers()

    async def request(i: int) -> None:  # asyncio.run per request, the client never closed
        client = AsyncClient(KEY, shared_gateway_url, poll=FAST, journal=path)
        await client.submit(f"a fox {i}")

    for i in range(5):
        anyio.run(request, i)
    assert settled(before, path) == (set(), 0)
