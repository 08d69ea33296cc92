"""The manifest (``batch/_report.py``): one row per line, in line order, written whole or not
at all, and read back one row at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imggw_client.batch._report import (
    MANIFEST_NAME,
    iter_manifest,
    manifest_row,
    manifest_rows,
    write_manifest,
)
from imggw_client.batch._schema import EXPIRED, SAVED, SUCCEEDED

from .ledgers import row

FILE = {"path": "7-0.png", "sha256": "ab" * 32, "size": 10}


def test_a_row_says_what_the_line_delivered_and_lists_files_only_once_saved() -> None:
    saved = manifest_row(
        row(
            1,
            SAVED,
            task_id="7",
            caller_id="hero",
            files=[FILE],
            credits=4.0,
            cost=0.01,
            expires_at=1_700_000_000.5,
        )
    )
    assert saved == {
        "line": 1,
        "task_id": "7",
        "status": "succeeded",
        "files": [FILE],
        "error": None,
        "id": "hero",
        "surface": "beta",
        "prompt": "p1",
        "aspect_ratio": "auto",
        "resolution": "1k",
        "cost": 0.01,
        "credits": 4.0,
        "expires_at": "2023-11-14T22:13:20.500000Z",
    }
    again = manifest_row(row(2, SUCCEEDED, task_id="8", files=[FILE]))  # its files are gone
    assert (again["status"], again["files"]) == ("running", [])
    expired = manifest_row(row(3, EXPIRED, task_id="9", error_code="result_expired"))
    assert (expired["status"], expired["error"]) == (
        "failed",
        {"code": "result_expired", "message": ""},
    )


def test_a_manifest_is_written_in_line_order_and_read_back_row_by_row(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, manifest_rows([row(1, SAVED, task_id="1"), row(2)]))
    assert path == tmp_path / MANIFEST_NAME
    assert [r["line"] for r in iter_manifest(path)] == [1, 2]
    path.write_text(path.read_text() + "\n" + json.dumps([1]) + "\n")
    with pytest.raises(ValueError, match=r"line 4 is not a JSON object"):
        list(iter_manifest(path))


def test_a_manifest_that_cannot_be_written_leaves_the_old_one_whole(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, manifest_rows([row(1)]))

    def rows_then_a_fault():  # type: ignore[no-untyped-def]
        yield manifest_row(row(1, SAVED, task_id="1"))
        raise OSError(28, "No space left on device")

    with pytest.raises(Exception, match="No space left on device"):
        write_manifest(tmp_path, rows_then_a_fault())
    assert [r["status"] for r in iter_manifest(path)] == ["pending"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_NAME]  # no temp file left
