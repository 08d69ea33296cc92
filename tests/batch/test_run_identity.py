"""A run's identity: written before anything is sent; every line's key follows from it, so a
re-run with every ledger deleted replays its tasks instead of billing new ones."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from imggw_client import PollPolicy, RequestValidationError, RetryPolicy
from imggw_client._core.states import State
from imggw_client._journal.schema import FORMAT, RUN_NAME
from imggw_client.batch import (
    LEDGER_NAME,
    BatchReport,
    InputChangedError,
    StorageError,
    run_batch,
)
from imggw_client.batch._identity import LINES_NAME, idempotency_key
from imggw_client.batch._ledger import Ledger
from imggw_client.mock import MockGateway

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05),
}


def batch(gw: MockGateway, source: Any, out: Path, **kw: Any) -> BatchReport:
    return run_batch(source, out, client_factory=lambda: gw.async_client(**FAST), **kw)


def write(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def keys_sent(gw: MockGateway, calls: list[str]) -> None:
    """Records the Idempotency-Key of every submit the gateway receives."""
    handle = gw.handle

    def spy(request: Any) -> Any:
        key = request.headers.get("idempotency-key")
        if request.method == "POST" and key:
            calls.append(key)
        return handle(request)

    gw.handle = spy  # type: ignore[method-assign]


@pytest.mark.gateway(fault_rate=1.0, faults=["reset"])  # nothing ever gets through
def test_the_run_id_is_written_before_anything_is_sent(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = write(tmp_path / "in.jsonl", ["a cat", "a dog"])
    report = batch(gateway, source, tmp_path / "out", timeout=0.3)
    assert report.exit_code == 3
    run = json.loads((tmp_path / "out" / RUN_NAME).read_text())
    assert len(run["run_id"]) == 32
    assert (tmp_path / "out" / LINES_NAME).stat().st_size == 2 * 16  # a 16-byte entry a line


# Every answer is lost: the gateway creates each task, the run never learns its id.
@pytest.mark.slow
@pytest.mark.gateway(duration_min=0.02, duration_max=0.05, fault_rate=1.0, faults=["lost"])
def test_every_ledger_deleted_mid_run_and_a_rerun_creates_no_new_task(
    gateway: MockGateway, tmp_path: Path
) -> None:
    sent: list[str] = []
    keys_sent(gateway, sent)
    source = write(tmp_path / "in.jsonl", [f"p{i}" for i in range(6)])
    out = tmp_path / "out"
    first = batch(gateway, source, out, timeout=0.4)
    assert first.exit_code == 3
    assert gateway.stats()["tasks_created"] == 6
    for path in out.glob(f"{LEDGER_NAME}*"):  # the ledger, its WAL and shared memory
        path.unlink()
    gateway.configure(fault_rate=0.0)
    second = batch(gateway, source, out)
    assert second.exit_code == 0
    assert gateway.stats()["tasks_created"] == 6  # the same keys, derived again: all replays
    assert gateway.stats()["replays"] >= 6
    run_id = json.loads((out / RUN_NAME).read_text())["run_id"]
    with Ledger.open(out) as ledger:
        rows = list(ledger.iter_rows())
    for row in rows:
        assert row.idempotency_key == idempotency_key(run_id, row.identity, row.digest)
    assert set(sent) == {row.idempotency_key for row in rows}  # never any other key


@pytest.mark.gateway(duration_min=0.02, duration_max=0.05)
def test_keys_differ_between_runs_and_lines_but_not_between_reruns(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = write(tmp_path / "in.jsonl", ["same prompt", "same prompt"])
    batch(gateway, source, tmp_path / "a")
    batch(gateway, source, tmp_path / "b")  # another folder: another run, other keys
    assert gateway.stats()["tasks_created"] == 4

    def keys(folder: Path) -> list[str | None]:
        with Ledger.open(folder) as ledger:
            return [row.idempotency_key for row in ledger.iter_rows()]

    a, b = keys(tmp_path / "a"), keys(tmp_path / "b")
    assert len(set(a)) == 2  # two lines, two logical requests, even with one prompt
    assert not set(a) & set(b)
    batch(gateway, source, tmp_path / "a")
    assert keys(tmp_path / "a") == a


def test_a_ledger_from_a_newer_imggw_is_refused_clearly(
    gateway: MockGateway, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        db.execute(f"PRAGMA user_version={FORMAT + 1}")
    with pytest.raises(StorageError, match="newer imggw"):
        batch(gateway, write(tmp_path / "in.jsonl", ["x"]), out)
    assert gateway.stats()["requests"] == {}


# The table of a ledger of the first release (format 0 or 1).
FIRST_FORMAT = (
    "CREATE TABLE lines (identity TEXT PRIMARY KEY, line INTEGER NOT NULL, caller_id TEXT,"
    " fingerprint TEXT NOT NULL, request TEXT NOT NULL, surface TEXT NOT NULL,"
    " idempotency_key TEXT NOT NULL, task_id TEXT, state TEXT NOT NULL,"
    " urls TEXT NOT NULL DEFAULT '[]', error_code TEXT, error_message TEXT,"
    " files TEXT NOT NULL DEFAULT '[]', credits REAL, cost REAL,"
    " created_at REAL NOT NULL, updated_at REAL NOT NULL)"
)


def test_a_ledger_of_the_first_format_is_brought_forward(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        db.execute(FIRST_FORMAT)
        db.execute(
            "INSERT INTO lines VALUES ('line:1', 1, NULL, 'fp', '{\"prompt\": \"a fox\"}', "
            "'beta', 'k1', 't1', 'done', '[]', NULL, NULL, '[]', 2.0, 0.5, 10.0, 20.0)"
        )
        db.commit()
    with Ledger.open(out) as ledger:
        (kept,) = ledger.iter_rows()
    assert (kept.digest, kept.fields, kept.state) == ("fp", {"prompt": "a fox"}, State.SAVED)
    assert (kept.credits, kept.cost) == (2.0, 0.5)
    with closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT
        columns = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
        times = db.execute("SELECT created, changed, charge FROM tasks").fetchone()
    assert {"kind", "fields", "expires_at", "planned", "first_sent"} <= columns
    assert times == (10.0, 20.0, 2.0)


@pytest.mark.gateway(duration_min=0.02, duration_max=0.05)
def test_a_first_format_folder_resumed_with_its_input_sends_nothing_again(
    gateway: MockGateway, tmp_path: Path
) -> None:
    # The first release's ledger: random keys, and digests of [prompt, ratio, resolution,
    # surface]. Read as today's, every line was changed: sent again under a new key, billed
    # twice, and the paid row dropped.
    prompts = ["a cat", "a dog", "a fox"]
    with gateway.client() as client:
        made = [client.submit(p, idempotency_key=f"first-{n}") for n, p in enumerate(prompts)]
    out = tmp_path / "out"
    out.mkdir()
    with closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        db.execute(FIRST_FORMAT)
        for n, (prompt, sub) in enumerate(zip(prompts, made, strict=True)):
            asked = [prompt, "auto", "1k", "beta"]
            digest = hashlib.sha256(json.dumps(asked).encode()).hexdigest()
            request = {"prompt": prompt, "aspect_ratio": "auto", "resolution": "1K"}
            task_id, state = (None, "pending") if n == 2 else (sub.task_id, "submitted")
            db.execute(
                "INSERT INTO lines (identity, line, fingerprint, request, surface, "
                "idempotency_key, task_id, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, 'beta', ?, ?, ?, 1.0, 1.0)",
                (f"line:{n + 1}", n + 1, digest, json.dumps(request), f"first-{n}", task_id, state),
            )
        db.commit()
    report = batch(gateway, write(tmp_path / "in.jsonl", prompts), out)
    assert (report.exit_code, report.changed_count) == (0, 0)
    assert gateway.stats()["tasks_created"] == 3  # the answer lost on line 3: its key replayed
    with Ledger.open(out) as ledger:
        rows = sorted(ledger.iter_rows(), key=lambda row: row.line)
    assert [(r.idempotency_key, r.task_id, r.state) for r in rows] == [
        (f"first-{n}", sub.task_id, State.SAVED) for n, sub in enumerate(made)
    ]


@pytest.mark.gateway(duration_min=0.02, duration_max=0.05)
def test_a_paid_line_changed_is_refused_even_with_the_inputs_record_gone(
    gateway: MockGateway, tmp_path: Path
) -> None:
    # With lines.fp deleted, an edited line was billed anew without --allow-changes and the
    # row of its paid, saved task dropped.
    source = write(tmp_path / "in.jsonl", ["a cat", "a dog"])
    out = tmp_path / "out"
    assert batch(gateway, source, out).exit_code == 0
    (out / LINES_NAME).unlink()
    write(source, ["a cat", "a wolf"])
    with pytest.raises(InputChangedError) as refused:
        batch(gateway, source, out)
    assert (refused.value.lines, refused.value.count) == ([2], 1)
    assert gateway.stats()["tasks_created"] == 2
    with Ledger.open(out) as ledger:
        assert sorted(row.state for row in ledger.iter_rows()) == [State.SAVED, State.SAVED]
    assert batch(gateway, source, out, allow_changes=True).exit_code == 0
    assert gateway.stats()["tasks_created"] == 3


@pytest.mark.gateway(duration_min=0.02, duration_max=0.05)
def test_comments_blank_lines_and_a_byte_order_mark_change_no_line(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("a cat\na dog\na wolf\n")
    out = tmp_path / "out"
    first = batch(gateway, source, out)
    assert first.exit_code == 0
    with Ledger.open(out) as ledger:
        keys = {row.identity: row.idempotency_key for row in ledger.iter_rows()}
    # Lines without ids are known by their place among the input's entries, not by their
    # line number: notes and spacing added anywhere (and an editor's BOM) are not changes.
    source.write_bytes("\ufeff# my prompts\n\na cat\n\n# dogs\na dog\na wolf\n".encode())
    sent = sum(gateway.stats()["requests"].values())
    second = batch(gateway, source, out)
    assert second.exit_code == 0
    assert second.changed_count == 0
    assert gateway.stats()["tasks_created"] == 3
    with Ledger.open(out) as ledger:
        rows = list(ledger.iter_rows())
    assert {row.identity: row.idempotency_key for row in rows} == keys
    assert sorted(row.line for row in rows) == [3, 6, 7]  # the manifest follows the new lines
    assert json.loads((out / "manifest.jsonl").read_text().splitlines()[0])["line"] == 3
    assert sum(gateway.stats()["requests"].values()) == sent  # all saved already: nothing sent


@pytest.mark.gateway(duration_min=0.02, duration_max=0.05)
def test_lines_with_ids_may_move_but_a_removed_line_is_a_change(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"

    def lines(*ids: str) -> None:
        source.write_text("".join(json.dumps({"id": i, "prompt": f"p {i}"}) + "\n" for i in ids))

    lines("a", "b", "c", "d")
    out = tmp_path / "out"
    assert batch(gateway, source, out).exit_code == 0
    lines("d", "c", "b", "a")  # reordered: the same requests, nothing new to pay for
    assert batch(gateway, source, out).changed_count == 0
    lines("d", "c", "a")  # "b", at line 3 now, is gone: maybe the wrong file, so ask
    with pytest.raises(InputChangedError) as info:
        batch(gateway, source, out)
    # Removed, named by its number in the run's input; nothing new or changed.
    assert (info.value.removed, info.value.removed_count) == ([3], 1)
    assert (info.value.lines, info.value.count) == ([], 0)
    assert "1 line(s) removed, as the run's input numbered them: 3" in info.value.message
    assert gateway.stats()["tasks_created"] == 4


@pytest.mark.gateway(duration_min=0.02, duration_max=0.05)
def test_a_damaged_input_record_is_refused_with_what_to_do(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = write(tmp_path / "in.jsonl", ["a cat", "a dog"])
    out = tmp_path / "out"
    assert batch(gateway, source, out).exit_code == 0
    record = out / LINES_NAME
    record.write_bytes(record.read_bytes()[:-3])  # a torn copy
    sent = sum(gateway.stats()["requests"].values())
    with pytest.raises(RequestValidationError, match=r"lines\.fp is damaged.*delete it"):
        batch(gateway, source, out)
    assert sum(gateway.stats()["requests"].values()) == sent
    record.unlink()  # as the message says: the rerun compares with nothing, replays all
    assert batch(gateway, source, out).exit_code == 0
    assert gateway.stats()["tasks_created"] == 2


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"format": 1}', "damaged"),
        (b'{"format": "2", "run_id": "ab"}', "damaged"),
        (b'{"format": 1, "run_id": 7}', "damaged"),
        (b'{"format": 99, "run_id": "ab"}', "newer imggw"),
        (b"[1, 2]", "damaged"),
        (b"{not json", "unreadable"),
    ],
)
def test_a_damaged_run_record_is_refused_before_anything_is_sent(
    gateway: MockGateway, tmp_path: Path, content: bytes, says: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / RUN_NAME).write_bytes(content)
    with pytest.raises(RequestValidationError, match=says):
        batch(gateway, write(tmp_path / "in.jsonl", ["a cat"]), out)
    assert sum(gateway.stats()["requests"].values()) == 0
