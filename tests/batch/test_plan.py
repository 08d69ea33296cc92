"""The plan (``batch/_plan.py``): one pass over the input before anything is sent (each line's
identity and key, repeated lines as bad ones, a changed input refused unless allowed, a refused
plan that keeps nothing), and the options of a run, checked once, each wrong one a clear error,
with the typed keywords (``RunOptions``) naming the same options as ``BatchOptions``.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_type_hints

import pytest

from imggw_client._core.exceptions import ConfigurationError, RequestValidationError
from imggw_client.batch._identity import (
    RUN_NAME,
    FolderIdentity,
    InputChangedError,
    idempotency_key,
)
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._lines import BatchInputError
from imggw_client.batch._plan import (
    LINE_TIMEOUT,
    BatchOptions,
    Caps,
    RunOptions,
    _Seen,
    plan_run,
    scan_input,
)
from imggw_client.batch._schema import RUNNING, UNKNOWN

from ..journals import TurkishRowcount


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


def test_a_repeated_id_is_seen_in_a_turkish_locale() -> None:
    """The ids a scan has seen are told from a repeat by the connection's count of changes,
    not by the INSERT's rowcount, which a Turkish locale makes -1 (every id then new)."""
    seen = _Seen(TurkishRowcount(sqlite3.connect(":memory:")))  # type: ignore[arg-type]
    line = SimpleNamespace(identity="id:hero")
    assert seen.add(line) is True  # type: ignore[arg-type]
    assert seen.add(line) is False  # type: ignore[arg-type]
    assert seen.add(SimpleNamespace(identity="id:other")) is True  # type: ignore[arg-type]


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


def test_the_keywords_and_the_options_are_the_same_names() -> None:
    assert set(get_type_hints(RunOptions)) == {f.name for f in fields(BatchOptions)}


def test_defaults_caps_time_and_keywords() -> None:
    options = BatchOptions()
    assert (options.concurrency, options.line_timeout, options.seconds) == (
        8,
        LINE_TIMEOUT,
        math.inf,
    )
    chosen = BatchOptions.of({"max_credits": 40, "max_failures": 3, "timeout": 60})
    assert chosen.caps == Caps(40, None, 3)
    assert chosen.seconds == 60.0
    assert BatchOptions.of(chosen.as_keywords()) == chosen


@pytest.mark.parametrize(
    ("options", "field", "says"),
    [
        ({"concurrency": 0}, "concurrency", "must be an integer >= 1"),
        ({"concurrency": True}, "concurrency", "must be an integer >= 1"),
        ({"timeout": math.inf}, "timeout", "must be a finite number of seconds >= 0"),
        ({"line_timeout": 0}, "line_timeout", "must be a finite number of seconds > 0"),
        ({"max_cost": -1}, "max_cost", "must be a number > 0, or None for no cap"),
        ({"max_failures": 1.5}, "max_failures", "must be an integer >= 1"),
        ({"format": "xml"}, "format", "must be one of jsonl, text, csv, or None"),
        ({"verify": "yes"}, "verify", "must be True or False"),
        ({"concurency": 4}, "concurency", "is not an option of a batch run (they are: "),
    ],
)
def test_each_wrong_option_is_one_clear_error(
    options: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(RequestValidationError) as raised:
        BatchOptions.of(options)
    assert raised.value.field == field
    assert says in raised.value.message


def test_an_unknown_surface_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="surface must be 'alpha' or 'beta'"):
        BatchOptions(surface="gamma")


def test_a_list_of_tasks_is_its_drivers_business_not_an_option() -> None:
    """DESIGN 19: ``collect_tasks`` (``download --from``) reads a list of tasks; no batch option
    turns a run into a collect."""
    assert "collect" not in {f.name for f in fields(BatchOptions)}
    assert "collect" not in get_type_hints(RunOptions)
    with pytest.raises(RequestValidationError, match="collect"):
        BatchOptions.of({"collect": True})
