"""One bad row is one bad row (DESIGN 22): rows another program wrote or a disk damaged (an
unknown state or surface, files that are not a JSON list of paths, an absurd or textual time,
bytes that are not text) are skipped by every reader, each reported once as a WARNING naming
its key (printable, bounded) and listed by ``Journal.damaged()``; every other row works in
``tasks()``, ``unfinished()`` and a collect. Over a real loopback socket."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import AsyncClient, Client
from imggw_client.mock import MockGateway
from imggw_client.tracking import DamagedRow, Journal, Tracker

from ..journals import FAST, KEY

# key -> the columns that make its row damaged (copied from a good row otherwise)
DAMAGED: dict[str, dict[str, Any]] = {
    "k-state": {"state": "zombie"},
    "k-files": {"files": "not json"},
    "k-files-list": {"files": "[1, 2]"},
    "k-huge-time": {"expires_at": 1e300},
    "k-text-time": {"submitted_at": "yesterday"},
    "k-surface": {"surface": "gamma"},
    "k-blob": {"prompt": b"\x00\xff"},
    "k-charge": {"charge": -4.0},
    "k-task-id": {"task_id": "../../etc"},
    "k-evil\x1b[31m" + "x" * 300: {"state": "zombie"},
}


def plant(path: Path, key: str, **columns: Any) -> None:
    """A copy of the first row under ``key``, with ``columns`` written over, as another program
    would write it; ``garbage`` puts bytes that are not UTF-8 in its prompt, as text."""
    garbage = columns.pop("garbage", None)
    with sqlite3.connect(path) as db:
        names = [r[1] for r in db.execute("PRAGMA table_info(tasks)") if r[1] != "row"]
        values = dict(
            zip(
                names,
                db.execute(f"SELECT {','.join(names)} FROM tasks WHERE row = 1").fetchone(),
                strict=True,
            )
        )
        values.update(columns, idempotency_key=key, task_id=columns.get("task_id", f"9{len(key)}"))
        marks = ",".join("?" * len(values))
        db.execute(
            f"INSERT INTO tasks ({','.join(values)}) VALUES ({marks})", list(values.values())
        )
        if garbage is not None:
            db.execute(
                "UPDATE tasks SET prompt = CAST(? AS TEXT) WHERE idempotency_key = ?",
                (garbage, key),
            )


@pytest.fixture
def journal_with_damage(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> tuple[MockGateway, str, Path, list[str]]:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        good = [client.submit("a fox").task_id, client.submit("an owl").task_id]
    for key, columns in DAMAGED.items():
        plant(path, key, **columns)
    plant(path, "k-not-utf8", garbage=b"\xff\xfe bad")
    return gw, url, path, good


def test_damaged_rows_are_skipped_and_reported_once_each_and_every_other_row_reads(
    journal_with_damage: tuple[MockGateway, str, Path, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, _, path, good = journal_with_damage
    journal = Journal(path)
    with caplog.at_level(logging.WARNING, logger="imggw_client"):
        listed = journal.tasks()
        again = journal.tasks(unfinished=True)
        journal.tasks(limit=1)
    assert sorted(e.task_id for e in listed) == sorted(good)  # type: ignore[type-var]
    assert sorted(e.task_id for e in again) == sorted(good)  # type: ignore[type-var]
    assert [e.task_id for e in journal.tasks(limit=1)] == [good[1]]  # the newest good one
    warnings = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(warnings) == len(DAMAGED) + 1  # each damaged row once, however often it is read
    assert all("\x1b" not in w for w in warnings)  # a key's control characters are shown escaped
    assert max(len(w) for w in warnings) < 400  # and a long key cut short
    damaged = journal.damaged()
    assert all(isinstance(d, DamagedRow) for d in damaged)
    assert {d.idempotency_key for d in damaged} >= {k for k in DAMAGED if k.isprintable()}
    reasons = {d.idempotency_key: d.reason for d in damaged}
    assert reasons["k-state"] == "unknown state"
    assert reasons["k-files"] == "files is not JSON"
    assert reasons["k-surface"] == "unknown surface"
    assert reasons["k-text-time"] == "submitted_at is not a time"
    assert reasons["k-huge-time"] == "expires_at is out of range"
    assert reasons["k-not-utf8"] == "request fields that are not text"
    journal.close()


def test_unfinished_and_a_collect_work_beside_damaged_rows(
    journal_with_damage: tuple[MockGateway, str, Path, list[str]], tmp_path: Path
) -> None:
    gw, url, path, good = journal_with_damage

    async def main() -> tuple[list[str], list[str]]:
        async with AsyncClient(KEY, url, poll=FAST, journal=path) as client:
            subs = await client.unfinished()
        async with AsyncClient(KEY, url, poll=FAST, journal=path) as client:
            report = await Tracker(client).collect(tmp_path / "out", wait=True)
        return [s.task_id for s in subs], report.saved

    found, saved = anyio.run(main)
    assert sorted(found) == sorted(good)
    assert sorted(saved) == sorted(good)
    assert gw.stats()["tasks_created"] == 2
    with sqlite3.connect(path) as db:
        db.text_factory = bytes  # a row holds bytes that are not text
        states = {
            k.decode(errors="replace"): s.decode()
            for k, s in db.execute("SELECT idempotency_key, state FROM tasks")
        }
    assert states["k-state"] == "zombie"  # left as it was
    assert [states[k] for k in states if not k.startswith("k-")] == ["saved", "saved"]
