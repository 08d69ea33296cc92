"""What a run tells: while it goes (:class:`BatchProgress`) and when it ends, every run's report
standing on :class:`RunOutcome` (lines per state, money, the input's counts, the guard's stop
and the exit code ``_schema.exit_code`` gives), a whole run's as :class:`BatchReport`, a
shard's as ``scale/_shards.ShardReport``; and ``manifest.jsonl``, one row per input line, in
line order, written whole or not at all: the one writer and reader of it, for a run, a shard
and a merge.

A manifest row has DESIGN 7's pinned fields (``line``, ``task_id``, ``status``, ``files``,
``error``), then the caller's ``id``, the surface, the request, money and link expiry, and for a
saved line that has one a ``warning`` (``code``, ``message``: its files kept their default
names). ``status`` is the line's word of ``_schema.STATUS``, from its state's ``line_state``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._core.config import RateLimit
from .._core.text import json_loads
from .._files import atomic_write
from ._lines import BadLine
from ._schema import (
    FINAL,
    SAVED,
    STATUS,
    ExitCode,
    LineState,
    Row,
    exit_code,
    line_state,
    statuses,
    storage_error,
    words,
)

__all__ = [
    "BatchProgress",
    "BatchReport",
    "MANIFEST_NAME",
    "RunOutcome",
    "iter_manifest",
    "manifest_row",
    "manifest_rows",
    "write_manifest",
]


_FINISHED = frozenset(line_state(state) for state in FINAL)  # the words of final lines


@dataclass(frozen=True)
class BatchProgress:
    """A snapshot for progress displays: lines per state (:class:`LineState`), money, speed,
    the request budget and the results waiting for download.

    ``rate_limit`` is the client's budget; ``least_time_left`` the fewest seconds it allows for
    the lines not yet submitted (None without a submit ceiling). ``awaiting_download`` counts
    finished results waiting for a download slot, ``soonest_expiry`` is the earliest link
    expiry among them, and ``at_risk`` how many of them will, at the current pace, expire
    before their turn. ``cost_unknown`` counts lines charged whose gateway stated no cost
    (surface alpha states credits only): ``cost`` leaves them out. ``max_credits`` and
    ``max_cost`` are the run's spend caps (None: none), against which ``credits`` and ``cost``
    are what the folder's run was charged so far; ``stopped_by`` names the guard that stopped
    new submits, once one did. ``typical_durations`` is what the client learned of how long the
    run's tasks take (the median, in seconds, per resolution; from its ledger when a run
    resumes): what its polls go by. ``gateway_silent_for`` is how many seconds the gateway has
    been asked and has answered nothing (no reply, or only 5xx ones); 0 while it answers.

    A snapshot is told as lines move (at most 4 a second) and every second while none moves.

    Example::

        run_batch("prompts.jsonl", "out/", on_progress=lambda p: print(p.counts, p.eta))
    """

    total: int
    counts: dict[LineState, int]
    credits: float
    cost: float
    elapsed: float
    finished_this_run: int
    rate_limit: RateLimit | None = None
    least_time_left: float | None = None
    awaiting_download: int = 0
    soonest_expiry: datetime | None = None
    at_risk: int = 0
    cost_unknown: int = 0
    max_credits: float | None = None
    max_cost: float | None = None
    stopped_by: str | None = None
    typical_durations: dict[str, float] = field(default_factory=dict)
    gateway_silent_for: float = 0.0

    @property
    def words(self) -> dict[str, int]:
        """Lines per word as a display shows them: pending, running (the task), downloading
        (its files), succeeded (saved), failed (expired included), zeros included."""
        return words(self.counts)

    @property
    def finished(self) -> int:
        """Lines in a final state: saved, failed or expired."""
        return sum(self.counts.get(word, 0) for word in _FINISHED)

    @property
    def throughput(self) -> float:
        """Lines finished per second in this run."""
        return self.finished_this_run / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds until every line is finished at the current pace, if it can be told."""
        left = self.total - self.finished
        return left / self.throughput if self.throughput > 0 else None


@dataclass(kw_only=True)
class RunOutcome:
    """What every run's report tells alike (a whole run's, a shard's): lines per state
    (:class:`LineState`), what the folder's run was charged in all (``credits``, ``cost``;
    ``cost_unknown`` lines whose gateway stated no cost, which ``cost`` leaves out), the
    input's bad, changed (run as new requests: the first ones, up to 1,000, and their count)
    and comment lines, the guard that stopped new submits (``stopped_by``, with
    ``stop_reason``) and the exit code as ``imggw batch`` gives it: 0 all saved, 1 some failed,
    expired or were bad input, 3 some unfinished (run again to resume), 6 a guard stopped new
    submits.

    Example::

        report = run_batch("prompts.jsonl", "out/")      # a BatchReport, a RunOutcome
        print(report.statuses, report.credits, report.exit_code)
    """

    counts: dict[LineState, int]
    elapsed: float
    credits: float = 0.0
    cost: float = 0.0
    cost_unknown: int = 0
    bad_count: int = 0
    changed_lines: list[int] = field(default_factory=list)
    changed_count: int = 0
    stopped_by: str | None = None
    stop_reason: str = ""
    comments: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def words(self) -> dict[str, int]:
        """Lines per word as a display shows them (see :attr:`BatchProgress.words`)."""
        return words(self.counts)

    @property
    def statuses(self) -> dict[str, int]:
        """Lines per status as the manifest and ``imggw batch status`` name them."""
        return statuses(self.counts)

    @property
    def exit_code(self) -> ExitCode:
        return exit_code(self.statuses, bad=self.bad_count, stopped_by=self.stopped_by)


@dataclass(kw_only=True)
class BatchReport(RunOutcome):
    """What a run did (see :class:`RunOutcome` for what every report tells).

    ``bad_lines`` holds the first bad lines (up to 1,000); ``bad_lines_file`` lists every one
    when there are more than 10. ``removed_lines`` (and ``removed_count``) are the lines the
    run's input had and this one has not, numbered as they were. ``previous_surface`` is the
    surface the folder's run was made on when this one moved it to another (with
    ``allow_changes``). ``comments`` counts the comment lines the input skipped (``#`` then
    whitespace or nothing: ``#hashtag sunset`` is a prompt). ``stopped_by`` is None, or
    ``"max_credits"``, ``"max_cost"``, ``"max_failures"``, ``"insufficient_credits"`` (lines
    already sent were finished and saved); ``max_credits``, ``max_cost`` and ``max_failures``
    are the run's guards.

    Example::

        report = run_batch("prompts.jsonl", "out/")
        print(report.counts, report.credits, report.manifest)
    """

    manifest: Path
    bad_lines: list[BadLine] = field(default_factory=list)
    removed_lines: list[int] = field(default_factory=list)
    removed_count: int = 0
    bad_lines_file: Path | None = None
    previous_surface: str | None = None
    max_credits: float | None = None
    max_cost: float | None = None
    max_failures: int | None = None


MANIFEST_NAME = "manifest.jsonl"


def manifest_row(row: Row) -> dict[str, Any]:
    """One manifest row of a ledger row. ``files`` lists the files of a saved line only (a
    line waiting to download them again may remember files that are gone)."""
    error = None
    if row.error_code is not None:
        error = {"code": row.error_code, "message": row.error_message or ""}
    note = None
    if row.state is SAVED and error is not None:  # a saved line's is a note (a name not used)
        note, error = error, None
    expires = None
    if row.expires_at is not None:
        moment = datetime.fromtimestamp(row.expires_at, tz=timezone.utc)
        expires = moment.isoformat().replace("+00:00", "Z")
    return {
        "line": row.line,
        "task_id": row.task_id,
        "status": STATUS[line_state(row.state)],
        "files": row.files if row.state is SAVED else [],
        "error": error,
        "id": row.caller_id,
        "surface": row.surface,
        "prompt": row.fields.get("prompt"),
        "aspect_ratio": row.fields.get("aspect_ratio"),
        "resolution": row.fields.get("resolution"),
        "cost": row.cost,
        "credits": row.credits,
        "expires_at": expires,
    } | ({"warning": note} if note is not None else {})


def manifest_rows(rows: Iterable[Row]) -> Iterator[dict[str, Any]]:
    """The manifest rows of ledger rows, as they come (line order in, line order out)."""
    return (manifest_row(row) for row in rows)


def write_manifest(folder: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> Path:
    """Writes ``folder/manifest.jsonl`` from rows in line order, whole or not at all (a temp
    file, then a rename); returns its path. Rows are written as they come: memory stays
    bounded.

    Example::

        run_batch("prompts.jsonl", "elsewhere/")
        Path("out").mkdir()
        write_manifest("out/", iter_manifest("elsewhere/manifest.jsonl"))
    """
    path = Path(folder) / MANIFEST_NAME
    try:
        with atomic_write(path) as handle:
            for row in rows:
                handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
    except OSError as exc:
        raise storage_error(path, exc) from exc
    return path


def iter_manifest(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The rows of a ``manifest.jsonl``, one at a time (blank lines skipped); a line that is
    not a JSON object raises ``ValueError`` naming it.

    Example::

        run_batch("prompts.jsonl", "out/")
        write_gallery("out/", iter_manifest("out/manifest.jsonl"))
    """
    with Path(path).open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            row = json_loads(text)
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {number} is not a JSON object")
            yield row
