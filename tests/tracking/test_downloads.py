"""The tracker's downloads (``tracking/_loop.py``): the soonest-expiring result first, the
results at risk of expiring in the queue, and links kept without the key."""

from __future__ import annotations

import time
from types import SimpleNamespace

import anyio
import pytest

from imggw_client import AsyncClient
from imggw_client._core.text import REDACTED
from imggw_client.batch._schema import Row
from imggw_client.tracking import _loop
from imggw_client.tracking._loop import DownloadQueue, kept_links

from ..batch.ledgers import row

pytestmark = pytest.mark.anyio


async def test_the_result_whose_links_die_first_is_downloaded_first() -> None:
    queue = DownloadQueue()
    now = time.time()
    rows = [
        row(1, expires_at=None),
        row(2, expires_at=now + 600),
        row(3, expires_at=now + 60),
        row(4, expires_at=None),
    ]
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


async def test_results_that_expire_before_their_turn_at_the_recent_pace_are_at_risk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = DownloadQueue()
    # The queue's wall clock stands still: the first link, alive for half a second more, is
    # alive at its turn however long the test takes to get there.
    now = 1_700_000_000.0
    monkeypatch.setattr(_loop, "time", SimpleNamespace(time=lambda: now))
    expiries = [now + 0.5, now + 1.5, now + 3600]
    assert queue.at_risk(expiries) == 0  # no pace known yet
    queue.downloaded.extend([100.0, 110.0])  # one download in ten seconds
    assert queue.at_risk(expiries) == 1  # the second waits ten seconds: its link is dead by then
    assert queue.at_risk([now - 1, now + 3600]) == 1  # already dead


def test_a_link_that_carries_the_key_is_kept_blanked() -> None:
    client = AsyncClient(api_key="sk-live-0123456789abcdef", base_url="http://127.0.0.1:9")
    urls = ["https://cdn.example/r/1.png?sig=sk-live-0123456789abcdef", "https://cdn.example/2.png"]
    assert kept_links(client, urls) == [f"https://cdn.example/r/1.png?sig={REDACTED}", urls[1]]
