"""The journal's file format (``_journal/schema.py``): a journal written by the first format
opens with every row kept and works on; its rows were made by no submit this code can name, so
no refusal removes them; a journal of a newer format is refused, untouched."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from imggw_client import ConfigurationError, ImageRequest, Submission
from imggw_client._core.states import Accepted, NotSent, Refused, Sending
from imggw_client._journal.schema import FORMAT
from imggw_client.tracking import Journal, Scope

SCOPE = Scope("http://127.0.0.1:9", "f" * 16)

FIRST_FORMAT = """
CREATE TABLE tasks (
    row INTEGER PRIMARY KEY, gateway TEXT NOT NULL, key_fp TEXT NOT NULL,
    surface TEXT NOT NULL, idempotency_key TEXT NOT NULL, task_id TEXT, state TEXT NOT NULL,
    prompt TEXT NOT NULL, aspect_ratio TEXT NOT NULL, resolution TEXT NOT NULL,
    created REAL NOT NULL, submitted_at REAL, expires_at REAL, charge REAL,
    files TEXT NOT NULL DEFAULT '[]', UNIQUE (gateway, key_fp, surface, idempotency_key)
);
CREATE INDEX tasks_by_id ON tasks (gateway, key_fp, surface, task_id);
CREATE INDEX tasks_by_state ON tasks (gateway, key_fp, state);
PRAGMA user_version=1;
"""


def test_a_first_format_journal_opens_with_its_rows_and_works_on(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(FIRST_FORMAT)
        db.executemany(
            "INSERT INTO tasks (gateway, key_fp, surface, idempotency_key, task_id, state, "
            "prompt, aspect_ratio, resolution, created) VALUES (?, ?, 'beta', ?, ?, ?, ?, "
            "'auto', '1k', 1700000000)",
            [
                (SCOPE.gateway, SCOPE.key_fingerprint, "k-old", None, "unknown", "a fox"),
                (SCOPE.gateway, SCOPE.key_fingerprint, "k-done", "5", "saved", "an owl"),
            ],
        )
    journal = Journal(path)
    assert [(e.idempotency_key, e.state) for e in journal.tasks()] == [
        ("k-done", "saved"),
        ("k-old", "unknown"),
    ]
    # Its first send's call is not known: neither a refusal nor a "never sent" removes it.
    journal.record(Refused("k-old", "beta", ""), SCOPE)
    journal.record(NotSent("k-old", "beta", "some-call"), SCOPE)
    journal.record(Sending("k-old", "beta", ImageRequest("a fox"), "call-2"), SCOPE)
    journal.record(
        Accepted(Submission(task_id="6", idempotency_key="k-old", surface="beta")), SCOPE
    )
    assert [(e.task_id, e.state) for e in journal.tasks()] == [("5", "saved"), ("6", "pending")]
    journal.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT
        columns = {r[1] for r in db.execute("PRAGMA table_info(tasks)")}
    assert {"attempt", "changed", "lease_owner", "lease_until"} <= columns
    # The one table's: what a batch folder's rows keep besides, empty in a journal.
    assert {"identity", "line", "kind", "fields", "credits", "cost", "planned"} <= columns


def test_a_journal_of_a_newer_format_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version={FORMAT + 1}")
    before = path.read_bytes()
    with pytest.raises(ConfigurationError) as refused:
        Journal(path)
    assert refused.value.code == "journal_unusable"
    assert "newer imggw" in refused.value.message
    assert path.read_bytes() == before
