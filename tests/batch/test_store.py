"""The batch's store on the tracker's loop (``batch/_store.py``): the ledger's rows as the loop's
items, what each needs by its state, one result saved through the loop against the in-process
reference gateway; a run's lines as they move (moves held to the table, the counts and money a
report shows, what a failure means for a line); and where a run works (what counts as a result
kept whole, the saved lines whose files are gone, leftovers of cut downloads, the manifest and
gallery a run writes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from imggw_client import ImageRequest, PollPolicy
from imggw_client._core.exceptions import (
    AuthenticationError,
    DownloadError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    ServerError,
    UnknownOutcomeError,
)
from imggw_client._core.states import State, Work
from imggw_client._core.text import REDACTED
from imggw_client._files import StorageError
from imggw_client.batch import _store
from imggw_client.batch._admission import BatchHooks, Charge
from imggw_client.batch._gallery import GALLERY_NAME
from imggw_client.batch._identity import RunIdentity
from imggw_client.batch._ledger import STOPPED_BY, Ledger
from imggw_client.batch._plan import BatchOptions
from imggw_client.batch._run import local_guard
from imggw_client.batch._schema import (
    EXPIRED,
    FAILED,
    LEDGER_NAME,
    RUNNING,
    SAVED,
    SUCCEEDED,
    UNKNOWN,
    read_meta,
)
from imggw_client.batch._store import (
    FATAL,
    LEFT_LOGGED,
    GalleryPace,
    LedgerStore,
    LocalStore,
    RunLines,
    Workspace,
    file_sha256,
    retry_later,
)
from imggw_client.mock import MockGateway
from imggw_client.tracking._loop import Loop

from .ledgers import planned, row, run_lines

QUERY = "GET /beta/v1/tasks/{id}"


def store_over(
    tmp_path: Path, ledger: object, redact: object = str
) -> tuple[RunLines, LedgerStore]:
    run = run_lines(ledger, tmp_path, redact=redact)  # type: ignore[arg-type]
    identity = RunIdentity("run", "digest", "beta", None)
    work = Workspace(tmp_path, ledger, identity, LocalStore(tmp_path))  # type: ignore[arg-type]
    return run, LedgerStore(run, work, "beta")


@pytest.mark.anyio
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
        run, store = store_over(tmp_path, ledger)
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


@pytest.mark.anyio
@pytest.mark.gateway(duration_min=0.01, duration_max=0.02)
async def test_a_result_is_saved_and_a_link_kept_blanked_is_asked_for_again(
    gateway: MockGateway,
    tmp_path: Path,
) -> None:
    async with gateway.async_client(
        poll=PollPolicy(initial_interval=0.01, max_interval=0.05)
    ) as client:
        sub = await client.submit("a fox", idempotency_key="k-1")
        task = await client.wait(sub)
        line = row(1, SUCCEEDED, task_id=task.id, urls=[f"https://x/{REDACTED}/0.png"])
        with planned(tmp_path, [line]) as ledger:
            run, store = store_over(tmp_path, ledger, client.redact)
            guard = local_guard(ledger, BatchOptions())
            hooks = BatchHooks(run, guard, run.room, GalleryPace(store.space))
            loop = Loop(client, store, hooks, run, concurrency=1)
            stored = ledger.rows()[0]
            before = gateway.stats()["requests"][QUERY]
            await loop.save_results(stored)
            assert gateway.stats()["requests"][QUERY] == before + 1  # the link asked for again
            assert stored.state is SAVED
            assert len(loop.queue.downloaded) == 1
            (saved,) = stored.files
            assert (tmp_path / saved["path"]).stat().st_size == saved["size"]
            assert saved["path"].startswith(task.id)
            assert store.prefix(row(2, surface="alpha")) == "alpha-"


@pytest.mark.anyio
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
        run, _ = store_over(tmp_path, ledger)
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


def run_over(
    ledger: Ledger,
    *,
    deadline: float = math.inf,
    line_timeout: float | None = None,
    redact=lambda text: text.replace("sk-secret", "***"),
) -> RunLines:
    return run_lines(ledger, deadline=deadline, line_timeout=line_timeout, redact=redact)


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_each_move_keeps_the_counts_the_times_and_the_ledger(tmp_path: Path) -> None:
    lines = [row(1), row(2, RUNNING, task_id="2")]
    with planned(tmp_path, lines) as ledger:
        run = run_over(ledger)
        told: list[int] = []
        run.tell = lambda at_once: told.append(1)
        first = ledger.rows()[0]
        first.task_id = "1"  # its submit answered
        run.move(first, RUNNING)
        run.move(first, SUCCEEDED)
        assert first.completed_at is not None
        assert first.finished_at is None
        run.move(first, SAVED)
        assert first.finished_at is not None
        assert (run.finished_here, run.total, len(told)) == (1, 2, 3)
        assert dict(run.counts) == {UNKNOWN: 0, RUNNING: 1, SUCCEEDED: 0, SAVED: 1}
        assert run.counts[RUNNING] + run.counts[SUCCEEDED] == 1  # one line still unsaved
        with pytest.raises(AssertionError, match="line 1: no move from saved to running"):
            run.move(first, RUNNING)  # not in the table
        second = ledger.rows()[1]
        run.fail(second, "content_policy", "refused")
        ledger.flush()
        assert [(r.state, r.error_code) for r in ledger.rows()] == [
            (SAVED, None),
            (FAILED, "content_policy"),
        ]


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_a_move_at_once_is_written_before_the_run_begins(tmp_path: Path) -> None:
    with planned(tmp_path, [row(1, SAVED, task_id="1")]) as ledger:
        run = run_over(ledger)
        run.move(ledger.rows()[0], SUCCEEDED, at_once=True)
        assert ledger.rows()[0].state is SUCCEEDED  # no flush needed: no writer thread


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_money_follows_charges_and_a_credit_without_a_cost_counts_as_unknown(
    tmp_path: Path,
) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        run = run_over(ledger)
        run.charged(Charge(), Charge(4.0, None))
        assert (run.credits, run.cost, run.cost_unknown) == (4.0, 0.0, 1)
        run.charged(Charge(4.0, None), Charge(4.0, 0.01))
        assert (run.credits, run.cost, run.cost_unknown) == (4.0, 0.01, 0)


def test_what_is_tried_again_later_and_what_ends_the_run() -> None:
    request = ImageRequest("a fox")
    lost = UnknownOutcomeError("lost", idempotency_key="k", request=request, surface="beta")
    assert retry_later(lost)  # its key makes another try safe
    assert retry_later(ServerError("boom", status_code=503))
    assert retry_later(RateLimitError("slow down", status_code=429))
    assert retry_later(DownloadError("reset", code="download_failed"))
    assert not retry_later(DownloadError("a page, not an image", code="not_an_image"))
    assert not retry_later(InvalidRequestError("bad", status_code=400))
    assert not retry_later(NotFoundError("gone", status_code=404))
    assert not retry_later(AuthenticationError("no", status_code=401))  # fatal, not later
    assert not retry_later(ValueError("a bug"))
    assert AuthenticationError in FATAL
    assert StorageError in FATAL


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_a_lines_step_gives_up_at_the_line_timeout_or_the_run_deadline(
    tmp_path: Path,
) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        assert run_over(ledger, deadline=5.0, line_timeout=60.0).line_deadline() == 5.0
        far = run_over(ledger, line_timeout=60.0).line_deadline()
        assert math.isfinite(far)
        assert run_over(ledger).line_deadline() == math.inf


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_lines_left_for_the_next_run_are_logged_one_by_one_then_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with planned(tmp_path, [row(1, RUNNING, task_id="77")]) as ledger:
        run = run_over(ledger)
        line = ledger.rows()[0]
        with caplog.at_level(logging.WARNING, logger="imggw_client"):
            for _ in range(LEFT_LOGGED + 5):
                run.left_for_next_run(line, "its status query failed (server_error)")
        assert run.left == LEFT_LOGGED + 5
        assert len(caplog.records) == LEFT_LOGGED
        assert caplog.records[0].getMessage() == (
            "line 1 (task 77): its status query failed (server_error); it stays running for "
            "the next run"
        )
        assert caplog.records[-1].getMessage().endswith("; later ones are counted, not logged")


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_an_unexpected_fault_ends_one_lines_step_and_never_logs_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        run = run_over(ledger)
        try:
            raise RuntimeError("header Authorization: Bearer sk-secret")
        except RuntimeError as exc:
            with caplog.at_level(logging.ERROR, logger="imggw_client"):
                run.unexpected_fault(ledger.rows()[0], exc)
        (record,) = caplog.records
        assert "sk-secret" not in record.getMessage()
        assert record.getMessage().startswith("line 1: unexpected RuntimeError at test_store.py:")
        assert run.fatal is None
        assert run.unexpected == 1


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_a_fatal_error_ends_the_run_once(tmp_path: Path) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        run = run_over(ledger)
        first = AuthenticationError("no", status_code=401)
        run.stop(first)
        run.stop(StorageError("disk", code="storage_failed"))
        assert run.fatal is first
        assert run.cancel.cancel_called
        assert run.why(AuthenticationError("no", code="unauthorized")) == "unauthorized"
        # Without a code, the message, cleaned of the key, says what went wrong.
        assert run.why(ServerError("Bearer sk-secret broke", status_code=500)) == "Bearer *** broke"


def saved(folder: Path, line: int, content: bytes) -> dict[str, object]:
    (folder / f"{line}-0.png").write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    return {"path": f"{line}-0.png", "sha256": digest, "size": len(content)}


def test_a_result_is_whole_by_its_size_or_with_hashes_by_its_sha256(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    kept = saved(tmp_path, 1, b"\x89PNG one")
    name, size, digest = str(kept["path"]), int(kept["size"]), str(kept["sha256"])  # type: ignore[call-overload]
    assert store.is_whole(name, size, digest, hashes=True)
    (tmp_path / name).write_bytes(b"\x89PNG two")  # same size, other bytes
    assert store.is_whole(name, size, digest, hashes=False)
    assert not store.is_whole(name, size, digest, hashes=True)
    assert not store.is_whole("missing.png", size, digest, hashes=False)
    assert file_sha256(tmp_path / "missing.png") is None
    (tmp_path / "link.png").symlink_to(tmp_path / name)
    with pytest.raises(StorageError):  # a link where a result was is refused, never counted
        store.is_whole("link.png", size, digest, hashes=False)


def test_saved_lines_whose_files_are_gone_are_found_and_leftovers_swept(tmp_path: Path) -> None:
    whole = saved(tmp_path, 1, b"one")
    gone = saved(tmp_path, 2, b"two")
    (tmp_path / "2-0.png").unlink()
    (tmp_path / ".3-0.png.abc.part").write_bytes(b"cut short")
    (tmp_path / "keep.part").write_bytes(b"not ours")
    rows = [
        row(1, SAVED, task_id="1", files=[whole]),
        row(2, SAVED, task_id="2", files=[gone]),
        row(3, UNKNOWN),
    ]
    with planned(tmp_path, rows) as ledger:
        work = Workspace(tmp_path, ledger, None, LocalStore(tmp_path))  # type: ignore[arg-type]
        assert [r.line for r in work.damaged(hashes=False)] == [2]
        work.sweep_partial_files()
    assert not (tmp_path / ".3-0.png.abc.part").exists()
    assert (tmp_path / "keep.part").exists()


def test_a_ledger_entry_that_names_no_file_of_the_folder_is_downloaded_again(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"one")
    digest = hashlib.sha256(b"one").hexdigest()
    odd = [
        {"path": str(outside), "sha256": digest, "size": 3},  # a path elsewhere, whole there
        {"path": "../elsewhere.png", "sha256": digest, "size": 3},
        {"path": "3-0.png", "size": 3},  # no sha256: not an entry a run writes
    ]
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "3-0.png").write_bytes(b"one")
    rows = [row(n, SAVED, task_id=str(n), files=[entry]) for n, entry in enumerate(odd, 1)]
    with planned(folder, rows) as ledger:
        work = Workspace(folder, ledger, None, LocalStore(folder))  # type: ignore[arg-type]
        assert [r.line for r in work.damaged(hashes=False)] == [1, 2, 3]


def test_the_end_of_a_run_writes_its_manifest_gallery_and_what_stopped_it(tmp_path: Path) -> None:
    ended: list[Path] = []

    class Store(LocalStore):
        def finish(self, manifest: Path) -> None:
            ended.append(manifest)

    with planned(tmp_path, [row(1), row(2)]) as ledger:
        work = Workspace(tmp_path, ledger, None, Store(tmp_path), gallery="my run")  # type: ignore[arg-type]
        manifest = work.write_outputs("max_credits")
    assert ended == [manifest]
    assert [json.loads(line)["line"] for line in manifest.read_text().splitlines()] == [1, 2]
    assert "my run" in (tmp_path / GALLERY_NAME).read_text()
    assert read_meta(tmp_path / LEDGER_NAME, STOPPED_BY) == "max_credits"
    with planned(tmp_path, [row(1), row(2)]) as ledger:
        Workspace(tmp_path, ledger, None, LocalStore(tmp_path)).write_outputs(None)  # type: ignore[arg-type]
    assert read_meta(tmp_path / LEDGER_NAME, STOPPED_BY) is None  # a run not stopped clears it


@pytest.mark.anyio
async def test_the_gallery_is_rewritten_now_and_then_never_more_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(_store, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    with planned(tmp_path, [row(1)]) as ledger:
        work = Workspace(tmp_path, ledger, None, LocalStore(tmp_path), gallery="g")  # type: ignore[arg-type]
        pace = GalleryPace(work)
        await pace.maybe()
        assert not (tmp_path / GALLERY_NAME).exists()  # not yet: just begun
        clock[0] += _store.GALLERY_EVERY
        await pace.maybe()
        assert (tmp_path / GALLERY_NAME).exists()
        (tmp_path / GALLERY_NAME).unlink()
        clock[0] += 1.0
        await pace.maybe()
        assert not (tmp_path / GALLERY_NAME).exists()
        none = GalleryPace(Workspace(tmp_path, ledger, None, LocalStore(tmp_path)))  # type: ignore[arg-type]
        clock[0] += 3600.0
        await none.maybe()  # a run that writes no gallery
    assert not (tmp_path / GALLERY_NAME).exists()
