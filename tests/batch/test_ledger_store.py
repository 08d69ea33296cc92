"""The batch's store on the tracker's loop (``batch/_ledger_store.py``): the ledger's rows as the
loop's items, what each needs by its state, the task states kept as line states, and one result
saved through the loop against the in-process reference gateway (a link kept blanked asked for
again, the files listed in the row, a task of the other surface named after it)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from imggw_client import PollPolicy
from imggw_client._core.states import State, Work
from imggw_client._core.surfaces import REDACTED
from imggw_client.batch._admission import BatchHooks, Room
from imggw_client.batch._identity import RunIdentity
from imggw_client.batch._plan import BatchOptions
from imggw_client.batch._run import local_guard
from imggw_client.batch._schema import EXPIRED, RUNNING, SAVED, SUCCEEDED, UNKNOWN
from imggw_client.batch._store import GalleryPace, LedgerStore, LocalStore, RunLines, Workspace
from imggw_client.mock import MockGateway
from imggw_client.tracking._loop import Loop

from .ledgers import planned, row

pytestmark = pytest.mark.anyio
QUERY = "GET /beta/v1/tasks/{id}"


def _store(tmp_path: Path, ledger: object, redact: object = str) -> tuple[RunLines, LedgerStore]:
    run = RunLines(
        ledger,
        ledger.totals(),
        Room(tmp_path),  # type: ignore[attr-defined,arg-type]
        deadline=math.inf,
        line_timeout=None,
        redact=redact,
    )  # type: ignore[arg-type]
    identity = RunIdentity("run", "digest", "beta", None)
    work = Workspace(tmp_path, ledger, identity, LocalStore(tmp_path))  # type: ignore[arg-type]
    return run, LedgerStore(run, work, "beta")


async def test_a_rows_work_follows_its_state_and_task_states_are_kept_as_line_states(
    tmp_path: Path,
) -> None:
    lines = [
        row(1),
        row(2, RUNNING, task_id="2"),
        row(3, SUCCEEDED, task_id="3"),
        row(4, SAVED, task_id="4"),
        row(5, SUCCEEDED, task_id="5"),
    ]
    with planned(tmp_path, lines) as ledger:
        run, store = _store(tmp_path, ledger)
        rows = store.chunk(0)
        assert [r.line for r in rows] == [1, 2, 3, 4, 5]
        assert [store.work(r) for r in rows] == [
            Work.RESEND,
            Work.WAIT,
            Work.DOWNLOAD,
            None,
            Work.DOWNLOAD,
        ]
        assert [r.line for r in store.chunk(3)] == [4, 5]
        first, _, third, _, fifth = rows
        first.task_id = "1"
        store.reached(first, State.RUNNING)
        store.reached(first, State.SUCCEEDED)
        assert first.state is SUCCEEDED
        store.reached(third, State.SAVED)
        assert third.state is SAVED
        fifth.files = [{"path": "5-0.png", "sha256": "0" * 64, "size": 1}]
        store.expire(fifth, "gone")
        assert fifth.state is EXPIRED
        assert fifth.error_code == "result_expired"
        assert fifth.error_message is not None
        assert fifth.error_message.startswith("the files saved earlier are gone")
        assert run.counts[UNKNOWN] == 0


async def test_a_result_is_saved_and_a_link_kept_blanked_is_asked_for_again(
    tmp_path: Path,
) -> None:
    gw = MockGateway(duration_min=0.01, duration_max=0.02)
    async with gw.async_client(poll=PollPolicy(initial_interval=0.01, max_interval=0.05)) as client:
        sub = await client.submit("a fox", idempotency_key="k-1")
        task = await client.wait(sub)
        line = row(1, SUCCEEDED, task_id=task.id, urls=[f"https://x/{REDACTED}/0.png"])
        with planned(tmp_path, [line]) as ledger:
            run, store = _store(tmp_path, ledger, client.redact)
            guard = local_guard(ledger, ledger.totals(), BatchOptions())
            hooks = BatchHooks(run, guard, run.room, GalleryPace(store.space))
            loop = Loop(client, store, hooks, run, concurrency=1)
            stored = ledger.rows()[0]
            before = gw.stats()["requests"][QUERY]
            await loop.save_results(stored)
            assert gw.stats()["requests"][QUERY] == before + 1  # the link asked for again
            assert stored.state is SAVED
            assert len(loop.queue.downloaded) == 1
            (saved,) = stored.files
            assert (tmp_path / saved["path"]).stat().st_size == saved["size"]
            assert saved["path"].startswith(task.id)
            assert store.prefix(row(2, surface="alpha")) == "alpha-"


async def test_a_templated_name_never_replaces_another_lines_file(tmp_path: Path) -> None:
    """Nor blocks the run: the result is paid for, so it keeps its default name, the line says
    so (``name_not_used``); a link planted where a name goes still stops the run."""
    from imggw_client._core.models import DownloadedFile
    from imggw_client._files import StorageError
    from imggw_client.batch._plan import NameTemplate
    from imggw_client.batch._store import NAME_NOT_USED

    first, second = row(1, SUCCEEDED, task_id="1"), row(2, SUCCEEDED, task_id="2")
    first.caller_id, second.caller_id = "cat", "cat-1"
    with planned(tmp_path, [first, second]) as ledger:
        run, _ = _store(tmp_path, ledger)
        identity = RunIdentity("run", "digest", "beta", None)
        work = Workspace(tmp_path, ledger, identity, LocalStore(tmp_path))  # type: ignore[arg-type]
        store = LedgerStore(run, work, "beta", NameTemplate.parse("{id}"))
        theirs = tmp_path / "cat-1.png"
        theirs.write_bytes(b"line 2's image")
        incoming = tmp_path / "in"
        incoming.mkdir()

        def result(index: int) -> DownloadedFile:
            path = incoming / f"1-{index}.png"
            path.write_bytes(b"line 1's image %d" % index)
            return DownloadedFile(
                url="https://cdn.example/x.png", path=path, size=16, sha256="0" * 64
            )

        named = store.named(first, [result(0), result(1)])  # its second would be cat-1
        assert [f.path.name for f in named] == ["cat.png", "1-1.png"]
        assert theirs.read_bytes() == b"line 2's image"
        assert (tmp_path / "cat.png").read_bytes() == b"line 1's image 0"
        assert (tmp_path / "1-1.png").read_bytes() == b"line 1's image 1"
        assert first.error_code == NAME_NOT_USED
        assert "'cat-1.png' (another file has that name)" in str(first.error_message)
        first.files = [{"path": "cat.png"}, {"path": "cat-1.png"}]  # as if it had been its own
        named = store.named(first, [result(0)])
        assert [f.path.name for f in named] == ["cat.png"]
        assert first.error_code is None  # named as asked this time
        (tmp_path / "cat.png").unlink()
        (tmp_path / "cat.png").symlink_to(tmp_path / "elsewhere.png")
        with pytest.raises(StorageError) as refused:
            store.named(first, [result(0)])
        assert refused.value.code == "symlink_refused"
        assert not (tmp_path / "elsewhere.png").exists()
