"""A run's downloads (``batch/_downloads.py``): the soonest-expiring result first, the results
at risk of expiring in the queue, links kept without the key, and one result saved against the
in-process reference gateway."""

from __future__ import annotations

import math
import time
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, PollPolicy
from imggw_client._core.surfaces import REDACTED
from imggw_client.batch._downloads import DownloadQueue, Downloads, kept_links
from imggw_client.batch._identity import RunIdentity
from imggw_client.batch._room import Room
from imggw_client.batch._run import RunLines
from imggw_client.batch._schema import Row
from imggw_client.batch._states import DOWNLOADING, SAVED
from imggw_client.batch._workspace import LocalStore, Workspace
from imggw_client.mock import MockGateway

from .ledgers import planned, row

pytestmark = pytest.mark.anyio
QUERY = "GET /beta/v1/tasks/{id}"


async def test_the_result_whose_links_die_first_is_downloaded_first() -> None:
    queue = DownloadQueue()
    now = time.time()
    rows = [row(1, expires_at=None), row(2, expires_at=now + 600), row(3, expires_at=now + 60),
            row(4, expires_at=None)]  # fmt: skip
    served: list[int] = []

    async def save(saved: Row) -> None:
        served.append(saved.line)

    async with anyio.create_task_group() as group:
        for each in rows:
            group.start_soon(queue.put, each)
        await anyio.wait_all_tasks_blocked()  # all four queued before the one slot opens
        assert len(queue) == 4
        assert queue.expiries() == [now + 60, now + 600]
        group.start_soon(queue.serve, save)
        while len(served) < 4:
            await anyio.wait_all_tasks_blocked()
        group.cancel_scope.cancel()
    assert served == [3, 2, 1, 4]  # then those of no known expiry, in the order they came


async def test_results_that_expire_before_their_turn_at_the_recent_pace_are_at_risk() -> None:
    queue = DownloadQueue()
    now = time.time()
    expiries = [now + 0.5, now + 1.5, now + 3600]
    assert queue.at_risk(expiries) == 0  # no pace known yet
    queue.downloaded.extend([100.0, 110.0])  # one download in ten seconds
    assert queue.at_risk(expiries) == 1  # the second waits ten seconds: its link is dead by then
    assert queue.at_risk([now - 1, now + 3600]) == 1  # already dead


def test_a_link_that_carries_the_key_is_kept_blanked() -> None:
    client = AsyncClient(api_key="sk-live-0123456789abcdef", base_url="http://127.0.0.1:9")
    urls = ["https://cdn.example/r/1.png?sig=sk-live-0123456789abcdef", "https://cdn.example/2.png"]
    assert kept_links(client, urls) == [f"https://cdn.example/r/1.png?sig={REDACTED}", urls[1]]


async def test_a_result_is_saved_and_a_link_kept_blanked_is_asked_for_again(
    tmp_path: Path,
) -> None:
    gw = MockGateway(duration_min=0.01, duration_max=0.02)
    async with gw.async_client(poll=PollPolicy(initial_interval=0.01, max_interval=0.05)) as client:
        sub = await client.submit("a fox", idempotency_key="k-1")
        task = await client.wait(sub)
        line = row(1, DOWNLOADING, task_id=task.id, urls=[f"https://x/{REDACTED}/0.png"])
        with planned(tmp_path, [line]) as ledger:
            run = RunLines(ledger, ledger.totals(), Room(tmp_path, flying=lambda: 0),
                           deadline=math.inf, line_timeout=None, redact=client.redact)  # fmt: skip
            identity = RunIdentity("run", "digest", "beta", None)
            work = Workspace(tmp_path, ledger, identity, LocalStore(tmp_path))  # type: ignore[arg-type]
            downloads = Downloads(client, run, work, "beta")
            stored = ledger.rows()[0]
            before = gw.stats()["requests"][QUERY]
            await downloads.save_results(stored)
            assert gw.stats()["requests"][QUERY] == before + 1  # the link asked for again
            assert stored.state is SAVED
            assert len(downloads.queue.downloaded) == 1
            (saved,) = stored.files
            assert (tmp_path / saved["path"]).stat().st_size == saved["size"]
            assert saved["path"].startswith(task.id)
            assert downloads.file_prefix(row(2, surface="alpha")) == "alpha-"
