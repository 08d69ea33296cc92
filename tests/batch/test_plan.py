"""The plan (``batch/_plan.py``): one pass over the input before anything is sent: each line's
identity and key, repeated lines as bad ones, a changed input refused unless allowed, and a
refused plan that keeps nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from imggw_client.batch._identity import (
    RUN_NAME,
    FolderIdentity,
    InputChangedError,
    idempotency_key,
)
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._lines import BatchInputError
from imggw_client.batch._plan import BatchOptions, plan_run, scan_input
from imggw_client.batch._schema import RUNNING, UNKNOWN


def plan(folder: Path, source: list[object], **options: object):  # type: ignore[no-untyped-def]
    with Ledger.open(folder) as ledger:
        identity = FolderIdentity(folder, surface="beta", derive=lambda: "run-1")
        made = plan_run(
            source, folder, ledger, identity, surface="beta", options=BatchOptions.of(options)
        )
        return made, ledger.rows()


def test_each_line_gets_its_identity_and_the_key_its_run_gives_it(tmp_path: Path) -> None:
    made, rows = plan(tmp_path, ["a fox", {"prompt": "a cat", "id": "cat"}, {"task_id": "77"}])
    assert [(r.identity, r.state) for r in rows] == [
        ("line:1", UNKNOWN),
        ("id:cat", UNKNOWN),
        ("task:beta:77", RUNNING),
    ]
    first = rows[0]
    assert first.idempotency_key == idempotency_key("run-1", "line:1", first.digest)
    assert rows[2].idempotency_key is None  # a task made elsewhere is never submitted
    assert (tmp_path / RUN_NAME).exists()
    assert made.bad_count == 0


def test_a_repeated_line_is_a_bad_line_and_a_bad_plan_keeps_nothing(tmp_path: Path) -> None:
    source = [{"prompt": "a", "id": "x"}, {"prompt": "b", "id": "x"}]
    with pytest.raises(BatchInputError) as raised:
        plan(tmp_path, source)
    assert [(b.line, b.reason) for b in raised.value.bad_lines] == [
        (2, "id repeats an earlier line")
    ]
    assert not (tmp_path / RUN_NAME).exists()
    with Ledger.open(tmp_path) as ledger:
        assert ledger.rows() == []
    made, rows = plan(tmp_path, source, skip_bad_lines=True)
    assert made.bad_count == 1
    assert [r.is_bad for r in rows] == [False, True]


def test_a_changed_input_is_refused_unless_allowed_then_only_new_lines_are_new(
    tmp_path: Path,
) -> None:
    plan(tmp_path, ["a fox", "a cat"])
    with pytest.raises(InputChangedError):
        plan(tmp_path, ["a fox", "a dog"])
    made, rows = plan(tmp_path, ["a fox", "a dog"], allow_changes=True)
    assert made.changed == [2]
    assert made.removed == []
    assert [r.fields["prompt"] for r in rows] == ["a fox", "a dog"]
    made, rows = plan(tmp_path, ["a fox"], allow_changes=True)
    assert made.changed == []
    assert made.removed == [2]


def test_a_scan_checks_an_input_with_no_ledger(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a fox\n# skipped\na cat\n")
    scan = scan_input(str(source), tmp_path, surface="beta", record=None, options=BatchOptions())
    try:
        assert (scan.plan.bad_count, scan.plan.comments) == (0, 1)
        assert len(scan.plan.input_digest) == 64
    finally:
        scan.discard()
