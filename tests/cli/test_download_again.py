"""`imggw download` run twice over the same folder (DESIGN 18): files already there with the
same bytes are reported saved (exit 0, the records printed with --json), only a different file
is a conflict (exit 2). Against the reference gateway on a real socket."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

from .helpers import imggw

# Seconds a test: real generates and downloads against a gateway on a socket (the slow lane, tests/conftest.py).
pytestmark = pytest.mark.slow


def finished_tasks(url: str, count: int) -> list[str]:
    ids = []
    for n in range(count):
        record = imggw("submit", f"a cat {n}", "--base-url", url, "--json").records()[0]
        ids.append(record["task_id"])
    for task_id in ids:
        assert imggw("poll", task_id, "--base-url", url, "-q").code == 0
    return ids


def test_downloading_the_same_tasks_twice_exits_0_and_prints_the_records_both_times(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    ids = finished_tasks(url, 3)
    folder = tmp_path / "dl"
    first = imggw("download", *ids, "--base-url", url, "-o", str(folder), "--json")
    assert first.code == 0, first.err
    saved = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = imggw("download", *ids, "--base-url", url, "-o", str(folder), "--json")
    assert again.code == 0, again.err
    assert again.records() == first.records()  # the same records: ids, paths, sha256, sizes
    assert [r["task_id"] for r in again.records()] == ids
    for record in again.records():
        (file,) = record["files"]
        path = Path(file["path"])
        assert hashlib.sha256(path.read_bytes()).hexdigest() == file["sha256"]
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == saved  # untouched
    plain = imggw("download", *ids, "--base-url", url, "-o", str(folder))
    assert plain.code == 0, plain.err
    assert plain.out.splitlines() == [r["files"][0]["path"] for r in first.records()]
    assert gw.stats()["tasks_created"] == 3


def test_a_different_file_of_that_name_is_still_a_conflict(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    ok, other = finished_tasks(url, 2)
    first = imggw("download", ok, other, "--base-url", url, "-o", str(tmp_path), "--json")
    assert first.code == 0, first.err
    mine = Path(first.records()[0]["files"][0]["path"])
    mine.write_bytes(b"mine")
    again = imggw("download", ok, other, "--base-url", url, "-o", str(tmp_path), "--json")
    assert again.code == 2
    assert "exists; pass --overwrite to replace it (file_exists)" in again.err
    assert mine.read_bytes() == b"mine"
    # The other task's file is the same as before: its record is printed, as saved.
    assert [r["task_id"] for r in again.records()] == [other]
