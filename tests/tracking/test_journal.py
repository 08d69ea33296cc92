"""A client's journal (DESIGN 19): each submit's row committed before its request leaves, then
its id, status, charge, expiry and files; nothing written without one; a file of ours alone
(0600 in a 0700 folder, no link followed); ``IMGGW_JOURNAL``; shared by processes. Over a real
loopback socket, against the reference gateway."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import (
    AsyncClient,
    Client,
    ConfigurationError,
    InsufficientCreditsError,
    TaskStatus,
)
from imggw_client._core.states import Seen
from imggw_client.mock import MockGateway, MockRequest, MockResponse
from imggw_client.tracking import Journal, JournalEntry

from ..journals import FAST, KEY, rows


def test_the_row_is_on_disk_before_the_submit_reaches_the_gateway(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "journal.sqlite"
    seen_at_arrival: list[list[dict[str, Any]]] = []
    keys: list[str] = []
    handle = gw.handle

    def spy(request: MockRequest) -> MockResponse:
        if request.method == "POST":
            keys.append(request.headers.get("idempotency-key", ""))
            seen_at_arrival.append(rows(path))
        return handle(request)

    gw.handle = spy  # type: ignore[method-assign]
    with Client(KEY, url, poll=FAST, journal=path) as client:
        task = client.generate("a lighthouse at dusk", aspect_ratio="16:9")
        files = client.download(task, tmp_path / "out")
    (before,) = seen_at_arrival
    assert [(r["idempotency_key"], r["state"], r["task_id"]) for r in before] == [
        (keys[0], "unknown", None)
    ]
    assert before[0]["prompt"] == "a lighthouse at dusk"
    (after,) = rows(path)
    assert (after["task_id"], after["state"], after["idempotency_key"]) == (
        task.id,
        "saved",
        keys[0],
    )
    assert json.loads(after["files"]) == [str(f.path) for f in files]
    assert after["charge"] == 4.0
    assert after["credits"] == task.credits == 4.0  # each as a batch line keeps it, too
    assert task.cost is not None
    assert after["cost"] == task.cost
    assert after["expires_at"] == task.expires_at.timestamp()  # type: ignore[union-attr]
    assert after["key_fp"] == client.key_fingerprint
    assert KEY.encode() not in path.read_bytes()


def test_entries_say_what_the_design_pins_newest_first(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    with Client(KEY, url, poll=FAST, journal=tmp_path / "j.sqlite") as client:
        first = client.generate("first", resolution="2k", aspect_ratio="3:2")
        second = client.submit("second")
        entries = client.journal.tasks()  # type: ignore[union-attr]
        assert [e.task_id for e in entries] == [second.task_id, first.id]
        newest, oldest = entries
        assert isinstance(newest, JournalEntry)
        assert (newest.status, newest.surface, newest.idempotency_key) == (
            "pending",
            "beta",
            second.idempotency_key,
        )
        assert oldest.status == "succeeded"
        assert oldest.request.resolution == "2k"
        assert oldest.request.aspect_ratio == "3:2"
        assert oldest.submitted_at is not None
        assert oldest.submitted_at.tzinfo is not None
        assert oldest.files == ()
        unfinished = client.journal.tasks(unfinished=True)  # type: ignore[union-attr]
        assert [e.task_id for e in unfinished] == [second.task_id, first.id]  # unsaved
        assert json.loads(json.dumps(newest.as_json()))["task_id"] == second.task_id


def test_without_a_journal_nothing_is_written(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = served_gateway
    monkeypatch.delenv("IMGGW_JOURNAL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    with Client(KEY, url, poll=FAST) as client:
        assert client.journal is None
        client.generate("a fox")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_journal_named_by_a_relative_path_stays_that_file_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A child forked after a chdir reopens its journal by path: the same file, not a new one.
    monkeypatch.chdir(tmp_path)
    journal = Journal("state/imggw.sqlite")
    monkeypatch.chdir(tmp_path.parent)
    assert journal.path == tmp_path / "state" / "imggw.sqlite"
    journal.close()


@pytest.mark.parametrize("value", ["off", "OFF", ""])
def test_imggw_journal_names_one_for_every_client_or_none(
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    _, url = served_gateway
    path = tmp_path / "env" / "journal.sqlite"
    monkeypatch.setenv("IMGGW_JOURNAL", str(path))
    with Client(KEY, url, poll=FAST) as client:
        assert client.journal is not None
        assert client.journal.path == path
        client.submit("a fox")
    assert len(rows(path)) == 1
    monkeypatch.setenv("IMGGW_JOURNAL", value)
    with Client(KEY, url, poll=FAST) as client:
        assert client.journal is None


def test_the_file_is_private_and_a_planted_link_is_refused_before_sending(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "state" / "imggw" / "journal.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        client.submit("a fox")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for side in ("-wal", "-shm"):
        extra = path.with_name(path.name + side)
        if extra.exists():
            assert stat.S_IMODE(extra.stat().st_mode) & 0o077 == 0
    target = tmp_path / "victim.db"
    target.write_bytes(b"not a journal")
    planted = tmp_path / "planted.sqlite"
    planted.symlink_to(target)
    requests = sum(gw.stats()["requests"].values())
    with pytest.raises(ConfigurationError) as refused:
        Client(KEY, url, journal=planted)
    assert refused.value.code == "journal_unsafe"
    assert "symbolic link" in refused.value.message
    assert target.read_bytes() == b"not a journal"
    assert sum(gw.stats()["requests"].values()) == requests


def test_a_named_journal_that_cannot_be_written_is_an_error_before_anything_is_sent(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("x")
    with pytest.raises(ConfigurationError) as refused:
        Client(KEY, url, journal=in_the_way / "journal.sqlite")
    assert refused.value.code == "journal_unusable"
    assert str(in_the_way) in refused.value.message
    assert KEY not in refused.value.message
    assert sum(gw.stats()["requests"].values()) == 0


@pytest.mark.gateway(credits=4.0, duration_min=0.01, duration_max=0.02)
def test_a_submit_the_gateway_refuses_leaves_no_row(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        client.submit("paid for")
        with pytest.raises(InsufficientCreditsError) as refused:
            client.submit("no credits left")
        assert refused.value.status_code == 402
    assert [r["prompt"] for r in rows(path)] == ["paid for"]
    assert gw.stats()["tasks_created"] == 1


def test_a_status_seen_by_get_and_a_gateway_going_back_are_recorded_by_the_table(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    path = tmp_path / "j.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        sub = client.submit("a fox")
        task = client.wait(sub)
        assert rows(path)[0]["state"] == "succeeded"
        running = task.model_copy(update={"status": TaskStatus.RUNNING})
        client.journal.record(Seen(running), client.journal_scope)  # a gateway going back
        assert rows(path)[0]["state"] == "succeeded"  # the table ignores a move back
        client.get(sub.task_id)
        assert rows(path)[0]["state"] == "succeeded"


@pytest.mark.slow
def test_processes_share_one_journal_without_locking_errors(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    path = tmp_path / "shared.sqlite"
    script = (
        "import sys\n"
        "from imggw_client import Client\n"
        "with Client(sys.argv[1], sys.argv[2], journal=sys.argv[3]) as c:\n"
        "    for i in range(15):\n"
        "        c.submit(f'p{sys.argv[4]}-{i}')\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, KEY, url, str(path), str(n)], stderr=subprocess.PIPE
        )
        for n in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    got = rows(path)
    assert len(got) == 60
    assert len({r["task_id"] for r in got}) == 60


def test_threads_of_one_client_and_an_async_client_record_every_task(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    path = tmp_path / "j.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        threads = [threading.Thread(target=client.submit, args=(f"t{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    async def main() -> None:
        journal = Journal(path)
        async with (
            AsyncClient(KEY, url, poll=FAST, journal=journal) as client,
            anyio.create_task_group() as group,
        ):
            for i in range(8):
                group.start_soon(client.submit, f"a{i}")

    anyio.run(main)
    assert len({r["task_id"] for r in rows(path) if r["task_id"]}) == 16


def test_a_journal_passed_in_is_the_callers_to_close(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    journal = Journal(tmp_path / "j.sqlite")
    with Client(KEY, url, poll=FAST, journal=journal) as client:
        client.submit("one")
        copy = client.with_options(timeout=5)
        assert copy.journal is journal
        copy.submit("two")
    assert len(journal.tasks()) == 2  # still open after the client closed
    journal.close()
    assert os.path.exists(tmp_path / "j.sqlite")


def test_mark_saved_keeps_urls_and_paths_as_given(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from imggw_client import ImageRequest, Submission, Task
    from imggw_client._core.states import Accepted, Sending
    from imggw_client.tracking import Scope

    scope = Scope("http://127.0.0.1:9", "f" * 16)
    journal = Journal(tmp_path / "j.sqlite")
    journal.record(Sending("k", "beta", ImageRequest("a fox")), scope)
    journal.record(Accepted(Submission(task_id="7", idempotency_key="k", surface="beta")), scope)
    done = Task(
        id="7",
        surface="beta",
        status=TaskStatus.SUCCEEDED,
        image_urls=["https://x/a"],
        expires_at=datetime.now(timezone.utc),
    )
    journal.record(Seen(done), scope)
    given = ["s3://bucket/p.png", "gs://b/k//double.png", "relative/q.png"]
    journal.mark_saved("7", "beta", [*given, tmp_path / "r.png"], scope=scope)
    (entry,) = journal.tasks()
    assert entry.files == (*given, str(tmp_path / "r.png"))  # not Path-normalised
    assert entry.state == "saved"
    assert json.loads(rows(tmp_path / "j.sqlite")[0]["files"])[0] == "s3://bucket/p.png"
    # A folder whose name is not UTF-8 (Latin-1 "café"), as Python names it: read back as it
    # was written, not as a damaged row that hid the paid task from every listing.
    latin = os.fsdecode(b"caf\xe9") + "/7-0.png"
    journal.mark_saved("7", "beta", [latin], scope=scope)
    (entry,) = journal.tasks()
    assert entry.files == (latin,)
    assert os.fsencode(entry.files[0]) == b"caf\xe9/7-0.png"
    assert journal.damaged() == []
    journal.close()
