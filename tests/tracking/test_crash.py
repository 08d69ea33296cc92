"""A journaled application killed at any moment loses no paid task (DESIGN 19): a process
running a dozen concurrent ``generate()`` calls is SIGKILLed (several seeds, one of them while
a submit it sent is held at the gateway, the task made, its answer not yet sent); a fresh
process's ``unfinished()`` + ``as_completed()`` saves every paid result, and the gateway made
exactly one task per submit the application began. Over a real loopback socket."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from imggw_client import Client, PollPolicy, TaskStatus
from imggw_client.mock import MockGateway

from ..held import Holder, held_gateway

pytestmark = pytest.mark.slow

KEY = "sk-crash-5e1b9d3f7a2c4860"
APP = """
import sys, anyio
from imggw_client import AsyncClient, PollPolicy

async def main() -> None:
    poll = PollPolicy(initial_interval=0.05, max_interval=0.2)
    async with AsyncClient(sys.argv[1], sys.argv[2], journal=sys.argv[3], poll=poll) as client:
        async with anyio.create_task_group() as group:
            for i in range(12):
                group.start_soon(client.generate, f"picture {i}")
    print("all done", flush=True)

anyio.run(main)
"""


# Beside its test, not in tests/gateways.py: a gateway that holds the hold-th submit until the
# app it answers is killed (tests/held.py).
@contextlib.contextmanager
def gateway(hold: int, seed: int) -> Iterator[tuple[MockGateway, Holder, str]]:
    gw = MockGateway(api_keys=[KEY], seed=seed, duration_min=0.2, duration_max=1.5)
    with held_gateway(gw, hold) as (holder, url):
        yield gw, holder, url


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_killed_app_leaves_every_paid_task_to_the_next_process(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    hold = rng.randint(1, 12)
    journal = tmp_path / "state" / "journal.sqlite"
    with gateway(hold, seed) as (gw, holder, url):
        app = subprocess.Popen(
            [sys.executable, "-c", APP, KEY, url, str(journal)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert holder.arrived.wait(60), "the held submit never arrived"
            # Killed while that submit is held, or a little later (seed 1: at once).
            if seed != 1:
                deadline = time.monotonic() + rng.uniform(0.0, 1.2)
                while time.monotonic() < deadline and app.poll() is None:
                    time.sleep(0.01)
        finally:
            os.kill(app.pid, signal.SIGKILL)
            out, _ = app.communicate(timeout=30)
        assert b"all done" not in out  # killed mid-run
        holder.release.set()  # the held task's answer goes nowhere: paid, its id unknown
        with sqlite3.connect(journal) as db:
            begun = db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
            unknown = db.execute("SELECT COUNT(*) FROM tasks WHERE task_id IS NULL").fetchone()[0]
        assert unknown >= 1  # at least the held submit: its outcome is unknown to the journal
        poll = PollPolicy(initial_interval=0.05, max_interval=0.2)
        with Client(KEY, url, journal=journal, poll=poll) as client:
            subs = client.unfinished()
            finished = list(client.as_completed(subs, timeout=60))
            for task in finished:
                if task.status is TaskStatus.SUCCEEDED:
                    client.download(task, tmp_path / "out")
            entries = client.journal.tasks()  # type: ignore[union-attr]
        stats = gw.stats()
    assert stats["tasks_created"] == begun  # one task per submit begun, never a second
    assert len(entries) == begun
    assert all(e.task_id is not None for e in entries)
    assert not [e for e in entries if e.unfinished]
    for entry in entries:
        if entry.state == "saved":
            assert entry.files
            assert all(Path(p).exists() and Path(p).stat().st_size > 0 for p in entry.files)
        else:
            assert entry.state == "failed"
    saved = {p.name for p in (tmp_path / "out").iterdir()} if (tmp_path / "out").exists() else set()
    assert len(saved) == sum(1 for e in entries if e.state == "saved")
