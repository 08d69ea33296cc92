"""The tracker (``tracking/_tracker.py``): ``Tracker.collect`` runs a journal's unfinished tasks
through the tracker's one run loop: a submit whose outcome is unknown sent again with its key
(the gateway makes one task, never two), every task waited on or asked once, results saved and
recorded in the journal, a task the gateway does not know failing alone, and the report's exit
codes 0/3/1. Over a real loopback socket, against the reference gateway."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, ImageRequest, Submission, Task, TaskStatus
from imggw_client._core.states import Accepted, Sending
from imggw_client.mock import MockGateway
from imggw_client.tracking import CollectReport, Tracker

from ..journals import FAST, KEY, rows


def _collect(url: str, journal: Path, dest: Path, **kw: object) -> tuple[CollectReport, list[Task]]:
    seen: list[Task] = []

    async def main() -> CollectReport:
        async with AsyncClient(KEY, url, poll=FAST, journal=journal) as client:
            return await Tracker(client).collect(dest, on_task=seen.append, **kw)  # type: ignore[arg-type]

    return anyio.run(main), seen


def test_collect_saves_every_journaled_task_and_resends_a_lost_submit_with_its_key(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"

    async def submit() -> None:
        async with AsyncClient(KEY, url, poll=FAST, journal=path) as client:
            await client.submit("a fox")
            await client.submit("an owl")
            # A submit whose answer was never read: its row says so, no request reached the
            # gateway (as a process killed the moment its row was committed).
            lost = Sending("lost-key-1", "beta", ImageRequest("a lost cat"))
            assert client.journal is not None
            client.journal.record(lost, client.journal_scope)

    anyio.run(submit)
    assert gw.stats()["tasks_created"] == 2
    report, seen = _collect(url, path, tmp_path / "out", wait=True)
    assert report.exit_code == 0
    assert len(report.saved) == 3
    assert (report.running, report.failed, report.expired) == ([], [], [])
    assert sorted(t.id for t in seen) == sorted(report.saved)  # on_task saw each one, terminal
    assert all(t.status is TaskStatus.SUCCEEDED for t in seen)
    assert gw.stats()["tasks_created"] == 3  # the lost submit made one task, with its key
    for task_id in report.saved:
        (saved,) = report.files[task_id]
        assert saved.path.name == f"{task_id}-0.png"  # the client's surface: the id alone
        assert saved.path.stat().st_size == saved.size
    assert {r["state"] for r in rows(path)} == {"saved"}  # the journal knows, through the client
    again, _ = _collect(url, path, tmp_path / "out", wait=True)
    assert (again.saved, again.exit_code) == ([], 0)  # nothing left to collect


@pytest.mark.slow
@pytest.mark.gateway(manual_clock=True)  # no task ends unless told
def test_without_wait_running_tasks_are_reported_and_an_unknown_one_fails_alone(
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"

    async def submit() -> None:
        async with AsyncClient(KEY, url, poll=FAST, journal=path) as client:
            await client.submit("still running")
            # A task the gateway does not know (another gateway's, or forgotten).
            journal, scope = client.journal, client.journal_scope
            assert journal is not None
            journal.record(Sending("k-gone", "beta", ImageRequest("gone")), scope)
            when = datetime.now(timezone.utc)
            journal.record(
                Accepted(
                    Submission(
                        task_id="999999",
                        idempotency_key="k-gone",
                        surface="beta",
                        submitted_at=when,
                    )
                ),
                scope,
            )

    anyio.run(submit)
    report, seen = _collect(url, path, tmp_path / "out", wait=False)
    asked = gw.stats()["requests"]
    again, _ = _collect(url, path, tmp_path / "out", wait=False)
    # Final: the second collect never asks about it again (one query, the running task's).
    assert sum(gw.stats()["requests"].values()) - sum(asked.values()) == 1
    assert (report.not_found, report.failed) == (["999999"], [])
    assert len(report.running) == 1
    assert report.saved == []
    assert report.exit_code == 1  # not found beats running
    assert seen == []  # nothing terminal
    assert gw.stats()["tasks_created"] == 1
    assert {r["task_id"]: r["state"] for r in rows(path)}["999999"] == "not_found"
    assert (again.not_found, again.running) == ([], report.running)


def test_a_tracker_needs_a_journal() -> None:
    with pytest.raises(ValueError, match="journal"):
        Tracker(AsyncClient(KEY, "http://127.0.0.1:9"))


def test_an_unexpected_fault_is_logged_without_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from imggw_client.tracking._tracker import _Entry, _JournalRun

    client = AsyncClient(KEY, "http://127.0.0.1:9")
    entry = _Entry(
        line=1, surface="beta", idempotency_key="k", task_id="7", submitted_at=None, fields={}
    )
    run = _JournalRun([entry], tmp_path, None, client.redact, client.surface)
    run.unexpected_fault(entry, RuntimeError(f"header Authorization: Bearer {KEY} refused"))
    anyio.run(client.close)
    assert KEY not in caplog.text
    assert "task 7: unexpected RuntimeError" in caplog.text
    assert "[redacted]" in caplog.text


def test_a_collect_removes_the_partial_files_a_killed_collect_left(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    import os

    _, url = served_gateway
    out = tmp_path / "out"
    out.mkdir()
    old = [out / ".123-0.deadbeef.part", out / ".alpha-9-1.0123abcd.part"]
    kept = [
        out / ".beta-124-0.deadbeef.part",  # written just now: a live download's
        out / ".notes.part",  # not of a collect's naming
        out / "beta-125-0.png",  # a result
    ]
    for path in (*old, *kept):
        path.write_bytes(b"x")
    for path in (*old, kept[1], kept[2]):
        os.utime(path, (1_000_000_000, 1_000_000_000))  # long before this run
    report, _ = _collect(url, tmp_path / "j.sqlite", out)
    assert report.exit_code == 0
    assert [p.exists() for p in old] == [False, False]
    assert all(p.exists() for p in kept)


def test_a_collect_counts_the_unfinished_tasks_of_other_keys_and_gateways(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    gw.configure(api_keys=[KEY, "sk-another-key-000000000"])

    async def submit() -> None:
        async with AsyncClient("sk-another-key-000000000", url, journal=path) as other:
            await other.submit("theirs")
            await other.submit("theirs too")
        async with AsyncClient(KEY, url.replace("127.0.0.1", "localhost"), journal=path) as alias:
            await alias.submit("mine, through another spelling of the URL")

    anyio.run(submit)
    report, _ = _collect(url, path, tmp_path / "out")
    assert (report.saved, report.exit_code) == ([], 0)
    assert report.other_scopes == 3
