"""A row a live process works on is not taken over by a sibling sharing the journal (DESIGN 22):
a submit leases its row to its process, a recovery (``unfinished()``, a collect) claims only the
rows no other live process holds; a process that is gone frees its rows at once on its host,
and a lease another host took lapses unless renewed. Over a real loopback socket, with a real
second process."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, Client
from imggw_client._journal import lease as _lease
from imggw_client._journal.lease import HOST, Leases
from imggw_client.mock import MockGateway
from imggw_client.tracking import CollectReport, Tracker

from ..journals import FAST, KEY, rows

pytestmark = pytest.mark.slow  # a second Python process

APP = """
import sys, anyio
from imggw_client import AsyncClient, PollPolicy

async def main() -> None:
    poll = PollPolicy(initial_interval=0.05, max_interval=0.2)
    async with AsyncClient(sys.argv[1], sys.argv[2], journal=sys.argv[3], poll=poll) as client:
        async def one(i: int) -> None:
            task = await client.generate(f"picture {i}", on_submit=lambda s: print("sent", flush=True))
            await client.download(task, sys.argv[4])
        async with anyio.create_task_group() as group:
            for i in range(10):
                group.start_soon(one, i)
    print("all done", flush=True)

anyio.run(main)
"""


@contextlib.contextmanager
def app(url: str, journal: Path, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The application, in a process of its own, once its ten submits were answered."""
    proc = subprocess.Popen(
        [sys.executable, "-c", APP, KEY, url, str(journal), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        for _ in range(10):
            assert proc.stdout.readline() == b"sent\n", proc.stderr.read() if proc.stderr else ""
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)


def _collect(url: str, journal: Path, dest: Path) -> CollectReport:
    async def main() -> CollectReport:
        async with AsyncClient(KEY, url, poll=FAST, journal=journal) as client:
            return await Tracker(client).collect(dest, wait=True, timeout=60)

    return anyio.run(main)


def downloads(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if "results" in route)


@pytest.mark.gateway(duration_min=0.5, duration_max=1.0)
def test_a_recovery_leaves_the_tasks_a_live_process_works_on(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    with app(url, path, tmp_path / "app") as proc:
        with Client(KEY, url, poll=FAST, journal=path) as client:
            assert client.unfinished() == []  # all ten are the application's
        report = _collect(url, path, tmp_path / "recovered")
        out, err = proc.communicate(timeout=60)
        assert b"all done" in out, err.decode()
    assert (report.saved, report.running, report.unresolved_keys) == ([], [], [])
    # Left to the live process that holds them, and said so: not a collect of everything.
    assert (report.held, report.exit_code) == (10, 3)
    assert downloads(gw) == 10  # each result once, by the process that made it (not 20)
    assert gw.stats()["tasks_created"] == 10
    assert [r["state"] for r in rows(path)] == ["saved"] * 10


@pytest.mark.gateway(manual_clock=True)  # no task ends unless told
def test_a_killed_process_frees_its_tasks_at_once(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    with app(url, path, tmp_path / "app") as proc:
        held = _collect(url, path, tmp_path / "out")
        assert (held.saved, held.held) == ([], 10)  # held by a live process
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    gw.advance(3600)
    report = _collect(url, path, tmp_path / "out")  # its pid is gone: no lease to wait out
    assert len(report.saved) == 10
    assert gw.stats()["tasks_created"] == 10


def test_a_lease_is_free_when_lapsed_or_its_process_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = Leases(tmp_path / "j.sqlite", ["pending"])
    now = 1_000_000.0
    live = f"{os.getppid()}@{HOST}#abc"  # the process that runs these tests' parent: alive
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert leases.free(None, None, now)
    assert leases.free(leases.owner, now + 10, now)  # its own
    assert leases.free(f"{os.getpid()}@{HOST}#other-journal", now + 10, now)  # this process's
    assert not leases.free(live, now + 10, now)
    assert leases.free(live, now - 1, now)  # lapsed
    assert leases.free(f"{gone.pid}@{HOST}#x", now + 10, now)  # gone: free at once
    assert not leases.free(f"{gone.pid}@another-host#x", now + 10, now)  # cannot tell: wait
    assert leases.free(f"{gone.pid}@another-host#x", now - 1, now)
    # What no lease of ours holds: a pid no process has (os.kill overflowed on it), an
    # expiry no renewal sets (it hid the row from every collect).
    assert leases.free(f"{'9' * 20}@{HOST}#x", now + 10, now)
    assert leases.free(f"0@{HOST}#x", now + 10, now)
    assert leases.free(f"{os.getppid()}@another-host#x", 1e300, now)
    assert not leases.free(live, now + 1000, now)  # a clock stepped back: its process tells
    monkeypatch.setattr(_lease, "LEASE_SECONDS", 2.0)
    assert leases.until(now) == now + 2.0


def test_a_live_process_renews_its_leases(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = served_gateway
    monkeypatch.setattr(_lease, "RENEW_EVERY", 0.01)
    path = tmp_path / "j.sqlite"

    def lease_until() -> float:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return float(db.execute("SELECT lease_until FROM tasks").fetchone()[0])

    with Client(KEY, url, poll=FAST, journal=path) as client:
        client.submit("a fox")  # its row is leased to this process, and renewed while it lives
        (row,) = rows(path)
        assert row["lease_owner"].startswith(f"{os.getpid()}@{HOST}#")
        deadline = time.monotonic() + 30
        while lease_until() <= row["lease_until"] and time.monotonic() < deadline:
            time.sleep(0.01)  # the renewer's next round (every 0.01 s here)
        assert lease_until() > row["lease_until"]
