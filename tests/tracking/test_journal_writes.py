"""How a journal's writes are made (issue 29: at most 1 ms a task): an ``AsyncClient`` commits
on its event loop's thread when the file is free, and hands a write to a worker thread when
another writer holds the file (still committed before its submit leaves) or a checkpoint is
due; an event that would change nothing this process wrote is not written; a forked child
writes on connections of its own. Over a real loopback socket where a client is involved."""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import AsyncClient, Client, ImageRequest, TaskStatus, _io_async
from imggw_client._core.states import Event, Seen, Sending, State, event_of, move
from imggw_client._journal import journal as journal_module
from imggw_client._journal.journal import CHECKPOINT_EVERY
from imggw_client.mock import MockGateway, MockRequest, MockResponse
from imggw_client.tracking import Journal, Scope

from ..journals import FAST, KEY, rows

SCOPE = Scope("http://127.0.0.1:9", "f" * 16)


def sending(key: str) -> Sending:
    return Sending(key, "beta", ImageRequest("a fox"))


def data_version(observer: sqlite3.Connection) -> int:
    """Changes whenever another connection commits a change to the file."""
    version: int = observer.execute("PRAGMA data_version").fetchone()[0]
    return version


def test_an_async_clients_writes_stay_on_the_loops_thread(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hop to a worker thread cost about 0.3 ms a write (1.4 ms a task, over the target):
    only the first write (a checkpoint, which syncs) leaves the loop's thread."""
    _, url = served_gateway
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    hops: list[str] = []
    hop = _io_async.run_sync

    async def counting(func: Any, *args: Any) -> Any:
        if "record" in getattr(func, "__name__", ""):  # the journal's (or, before, the client's)
            hops.append(func.__name__)
        return await hop(func, *args)

    monkeypatch.setattr(_io_async, "run_sync", counting)

    async def main() -> None:
        async with AsyncClient(KEY, url, poll=FAST, journal=journal) as client:
            for i in range(4):
                task = await client.generate(f"fox {i}")
                await client.download(task, tmp_path / "out")

    anyio.run(main)
    assert [r["state"] for r in rows(path)] == ["saved"] * 4  # 16 to 20 events written
    assert hops == ["record"]
    journal.close()


def test_a_busy_file_sends_the_write_to_a_worker_thread_and_the_submit_waits_for_it(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the write lock: the submit's row waits for it off the loop (the
    busy timeout), other work on the loop goes on, and the request leaves only once the row
    is committed."""
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    at_arrival: dict[str, list[dict[str, Any]]] = {}
    handle = gw.handle

    def spy(request: MockRequest) -> MockResponse:
        if request.method == "POST" and b"busy" in request.body:
            at_arrival["held"] = rows(path)
        return handle(request)

    gw.handle = spy  # type: ignore[method-assign]
    hop = _io_async.run_sync
    waiting: list[anyio.Event] = []

    async def spying(func: Any, *args: Any) -> Any:
        if getattr(func, "__self__", None) is journal:
            waiting[0].set()
        return await hop(func, *args)

    async def main() -> None:
        waiting.append(anyio.Event())
        async with (
            AsyncClient(KEY, url, poll=FAST, journal=journal) as client,
            AsyncClient(KEY, url, poll=FAST, journal=False) as other,
        ):
            await client.generate("before the lock")  # its first write checkpoints, off the loop
            monkeypatch.setattr(_io_async, "run_sync", spying)
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")  # a writer of another process holds the file
            held: list[Any] = []

            async def busy() -> None:
                held.append(await client.generate("while the file is busy"))

            async with anyio.create_task_group() as group:
                group.start_soon(busy)
                with anyio.fail_after(30):  # a guard: the event comes at once
                    await waiting[0].wait()
                # The loop is free meanwhile: another call on it goes all the way.
                assert (await other.generate("on the same loop")).status is TaskStatus.SUCCEEDED
                assert gw.stats()["tasks_created"] == 2  # the held submit has not left
                assert "held" not in at_arrival
                blocker.execute("COMMIT")
            blocker.close()
            assert held[0].status is TaskStatus.SUCCEEDED

    anyio.run(main)
    (row,) = [r for r in at_arrival["held"] if r["prompt"] == "while the file is busy"]
    assert (row["state"], row["task_id"]) == ("unknown", None)  # on disk before it left
    assert gw.stats()["tasks_created"] == 3
    assert sorted(r["state"] for r in rows(path)) == ["succeeded", "succeeded"]
    journal.close()


def test_try_record_declines_at_once_while_another_writer_holds_the_file(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    journal.record(sending("k1"), SCOPE)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    answer: list[bool] = []
    attempt = threading.Thread(
        target=lambda: answer.append(journal.try_record(sending("k2"), SCOPE))
    )
    attempt.start()
    attempt.join(timeout=10)  # a guard: waiting would take the 30 s busy timeout
    assert answer == [False]
    blocker.execute("COMMIT")
    blocker.close()
    assert [r["idempotency_key"] for r in rows(path)] == ["k1"]  # nothing half-written
    assert journal.try_record(sending("k2"), SCOPE)
    assert [r["idempotency_key"] for r in rows(path)] == ["k1", "k2"]
    journal.close()


def test_the_loops_writes_leave_checkpoints_to_a_worker_thread_and_the_wal_stays_small(
    tmp_path: Path,
) -> None:
    """The loop's connection never checkpoints (a checkpoint syncs the file): the first write
    and every ``CHECKPOINT_EVERY``-th are declined, and ``record`` checkpoints, so the WAL
    holds at most ``CHECKPOINT_EVERY`` writes."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    declined = []
    for i in range(4 * CHECKPOINT_EVERY):
        if not journal.try_record(sending(f"k{i}"), SCOPE):
            declined.append(i)
            journal.record(sending(f"k{i}"), SCOPE)
    assert declined == [0, CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY, 3 * CHECKPOINT_EVERY]
    with closing(sqlite3.connect(path)) as observer:
        _, frames, _ = observer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        written = observer.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
    assert written == 4 * CHECKPOINT_EVERY
    assert frames <= 5 * CHECKPOINT_EVERY  # about 4 pages a write since the last checkpoint
    journal.close()


def test_a_due_checkpoint_goes_to_one_write_and_the_loops_other_writes_go_on(
    tmp_path: Path,
) -> None:
    """32 tasks at once must not all hop to threads while one checkpoint is pending."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    journal.record(sending("first"), SCOPE)  # a process's first write checkpoints
    for i in range(CHECKPOINT_EVERY - 1):
        assert journal.try_record(sending(f"k{i}"), SCOPE)
    assert not journal.try_record(sending("due"), SCOPE)  # its caller's record() checkpoints
    assert journal.try_record(sending("meanwhile"), SCOPE)  # the loop's others go on
    journal.record(sending("due"), SCOPE)  # as the caller's worker thread does
    with closing(sqlite3.connect(path)) as observer:
        _, frames, _ = observer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        written = observer.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
    assert written == CHECKPOINT_EVERY + 2
    assert frames <= 8  # all checkpointed, then the WAL restarted by that one write
    journal.close()


def test_a_status_seen_again_is_not_written_and_a_new_link_expiry_is(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    path = tmp_path / "j.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        task = client.wait(client.submit("a fox"))
        assert task.expires_at is not None
        with closing(sqlite3.connect(path)) as observer:
            before = data_version(observer)
            for _ in range(3):
                assert client.get(task.id).status is TaskStatus.SUCCEEDED
            assert data_version(observer) == before  # three queries, nothing committed
            later = task.model_copy(update={"expires_at": task.expires_at + timedelta(hours=1)})
            client.journal.record(Seen(later), client.journal_scope)  # type: ignore[union-attr]
            assert data_version(observer) != before  # a refreshed link is news
        client.download(task, tmp_path / "out")
        (row,) = rows(path)
        assert row["expires_at"] == later.expires_at.timestamp()  # type: ignore[union-attr]
        assert row["state"] == "saved"
        with closing(sqlite3.connect(path)) as observer:
            before = data_version(observer)
            client.journal.record(Seen(later), client.journal_scope)  # type: ignore[union-attr]
            assert data_version(observer) == before  # "succeeded" after "saved": no move
    assert rows(path)[0]["state"] == "saved"


def test_a_status_the_table_ignores_at_one_state_it_ignores_at_every_later_one() -> None:
    """Why a status seen again may skip the file: the row may have moved on since this
    process wrote it (another process saved it), never back, and what the table ignores at
    the state remembered it ignores at any state after it. Saved and expired events lack this
    (``saved`` is ignored at ``running``, not at ``succeeded``): they are always written."""

    def after(state: State) -> set[State]:
        found, todo = {state}, [state]
        while todo:
            here = todo.pop()
            for event in Event:
                nxt = move(here, event)
                if nxt is not None and nxt not in found:
                    found.add(nxt)
                    todo.append(nxt)
        return found

    statuses = [event_of(status) for status in TaskStatus]
    for state in State:
        for event in statuses:
            if move(state, event) is state:
                for later in after(state):
                    assert move(later, event) is later, (state, event, later)
    assert move(State.RUNNING, Event.SAVED) is State.RUNNING
    assert move(State.SUCCEEDED, Event.SAVED) is State.SAVED


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only")
@pytest.mark.parametrize(
    "case",
    [
        "a_child_forked_while_another_thread_is_in_the_journal_does_not_hang",
        "a_forked_child_writes_on_connections_of_its_own",
    ],
)
def test_forks_from_an_interpreter_of_their_own(tmp_path: Path, case: str) -> None:
    # A test worker may hold threads of earlier tests inside SQLite (lease renewers, ledger
    # writers): a child forked from it can inherit one of SQLite's own mutexes held, and hang.
    # Each case forks from a fresh interpreter, whose only threads are the case's.
    code = (
        "from pathlib import Path\n"
        f"from tests.tracking.test_journal_writes import _{case} as case\n"
        f"case(Path({str(tmp_path)!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr


def fork() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork() with threads
        return os.fork()


def _a_child_forked_while_another_thread_is_in_the_journal_does_not_hang(
    tmp_path: Path,
) -> None:
    # A thread inside the journal (its lock held) as the process forks: the child inherits
    # the lock held, and no thread of its own ever lets it go.
    journal = Journal(tmp_path / "j.sqlite")
    journal.record(sending("parent-1"), SCOPE)
    inside, leave = threading.Event(), threading.Event()

    def listing() -> None:
        with journal._lock, journal._leases._lock:  # where tasks() and the renewer are
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=listing)
    thread.start()
    assert inside.wait(10)
    try:
        pid = fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                journal.record(sending("child-1"), SCOPE)
                code = 0 if len(journal.tasks()) == 2 else 2
            finally:
                os._exit(code)
        for _ in range(1000):  # 10 s at most: a hung child is killed, and fails the test
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    finally:
        leave.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0


def _a_forked_child_writes_on_connections_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    journal.record(sending("parent-1"), SCOPE)
    assert journal.try_record(sending("parent-2"), SCOPE)  # the loop's connection is open
    # The child says when its writes are done and lives on until the parent wrote: a write
    # of each at once finds the file busy, which try_record rightly declines.
    written, go_on = os.pipe(), os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            declined = not journal.try_record(sending("child-1"), SCOPE)  # not its handles
            journal.record(sending("child-1"), SCOPE)  # opens the child's own
            code = 0 if declined and journal.try_record(sending("child-2"), SCOPE) else 2
            os.write(written[1], b"1")
            os.read(go_on[0], 1)
            journal.close()
        finally:
            os._exit(code)
    os.close(written[1])  # a child that failed first ends the read: EOF, not a hang
    # A child that hangs (SQLite's own mutexes, held by a thread of the parent as it forked)
    # fails the test at a bound, never hangs the suite.
    ready, _, _ = select.select([written[0]], [], [], 30)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child did not write within 30 s")
    assert os.read(written[0], 1) == b"1"
    assert journal.try_record(sending("parent-3"), SCOPE)  # while the child lives
    os.write(go_on[1], b"1")
    _, status = os.waitpid(pid, 0)
    for end in (written[0], *go_on):
        os.close(end)
    assert os.waitstatus_to_exitcode(status) == 0
    assert journal.try_record(sending("parent-4"), SCOPE)  # the parent's handles still work
    assert sorted(r["idempotency_key"] for r in rows(path)) == [
        "child-1",
        "child-2",
        "parent-1",
        "parent-2",
        "parent-3",
        "parent-4",
    ]
    journal.close()


def test_an_async_client_made_inside_a_loop_never_opens_its_journal_there(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the file (a journal in the old rollback mode, locked while it is
    opened): the constructor returns at once; the first submit opens it in a worker thread,
    the loop runs meanwhile, and the request leaves once its row is committed."""
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    monkeypatch.setattr(journal_module, "BUSY_TIMEOUT_MS", 5_000)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("CREATE TABLE other (x)")  # a database not in WAL yet: opening it waits
    locker.execute("BEGIN EXCLUSIVE")
    ticks = 0

    async def main() -> None:
        nonlocal ticks
        client = AsyncClient(KEY, url, poll=FAST, journal=path)  # under the lock: at once
        assert client.journal is not None
        assert client.journal._db is None  # not opened on the loop
        async with client, anyio.create_task_group() as group:
            done = anyio.Event()

            async def submit() -> None:
                await client.submit("a fox")
                done.set()

            group.start_soon(submit)
            while ticks < 50:  # the loop goes on while the journal is opened off it
                ticks += 1
                await anyio.sleep(0)
            assert not done.is_set()
            assert gw.stats()["tasks_created"] == 0  # its row is not committed: not sent
            locker.execute("ROLLBACK")
            await done.wait()

    try:
        anyio.run(main)
    finally:
        locker.close()
    assert ticks == 50
    assert [r["state"] for r in rows(path)] == ["pending"]
    assert gw.stats()["tasks_created"] == 1
