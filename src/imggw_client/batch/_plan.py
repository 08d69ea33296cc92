"""The plan: one pass over a run's input, before anything is sent, for every kind of run.

Each line is read and checked (bad lines, repeated ids), given its identity, its request's
digest and its idempotency key (a pure function of the run's identity), and compared with the
record of the input the run was made for (``_identity.LineDigests``), so that a changed input is
refused, unless allowed, before a single request goes out. Where the lines go is the caller's:
a run (or a shard) puts them in its ledger, in one transaction that commits only when the run
may go (:func:`plan_run`); the Dask driver and a shard that makes a run's identity only check
them (:func:`scan_input`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from .._core.config import check_surface
from .._core.exceptions import RequestValidationError
from .._files import create_new, refuse_link, temp_name
from . import _identity
from ._input import parse_lines
from ._ledger import INVALID_LINE, Ledger
from ._lines import (
    BAD_LINES_NAME,
    COLLECT,
    SHOWN_BAD_LINES,
    BadLine,
    BatchInputError,
    InputLine,
    Tally,
    Where,
)
from ._options import BatchOptions
from ._schema import BAD, FAILED, RUNNING, UNKNOWN, Row, storage_error

__all__ = [
    "WHOLE",
    "FolderIdentity",
    "IdentityStore",
    "Plan",
    "Scan",
    "Slice",
    "plan_run",
    "scan_input",
]

BAD_LINES_KEPT = 1000  # bad lines a report holds; all of them go to bad-lines.txt


@dataclass(frozen=True)
class Slice:
    """The part of an input a run reads: ``lines`` keeps only those line numbers (a shard's
    range; None: all), ``first_line`` and ``first_entry`` number the source's first line and
    entry (a shard's slice of a larger input keeps its lines' numbers; see ``iter_lines``);
    ``sliced``: the source is a slice of a larger input, which its cutter checked whole."""

    lines: range | None = None
    first_line: int = 1
    first_entry: int = 1
    sliced: bool = False


WHOLE = Slice()


@dataclass
class Plan:
    """What the pass found: bad lines (the first ones, and how many), lines new or changed and
    removed since the run's record of its input, the surface the run was made on if this one
    moves it, the input's digest, and the comment lines it skipped."""

    bad: list[BadLine] = field(default_factory=list)
    bad_count: int = 0
    bad_file: Path | None = None
    changed: list[int] = field(default_factory=list)
    changed_count: int = 0
    removed: list[int] = field(default_factory=list)
    removed_count: int = 0
    previous_surface: str | None = None
    input_digest: str = ""
    comments: int = 0


class IdentityStore(Protocol):
    """Where a run's identity is kept: the run id every key follows from, the surface it was
    made on, and the record of its input the plan compares with (a single run's folder, or a
    shard's: ``_shards``)."""

    run_id: str

    def previous_surface(self) -> str | None:
        """The surface the run was made on, if the store tells it."""

    def digests(self) -> _identity.LineDigests:
        """A comparison of the input with the record, written beside it until accepted."""

    def accept(self, digests: _identity.LineDigests, input_digest: str) -> None:
        """The plan goes: keep what it compared as the record (before anything is sent)."""


class FolderIdentity:
    """A single run's identity, in its output folder: ``run.json`` and ``lines.fp``. A folder
    with no ``run.json`` gets the run id ``derive`` makes (the same for the same folder,
    gateway and key: a folder made again replays its tasks), or a random one with
    ``new_run`` (refused where a run is already kept: that folder's lines have their keys).
    ``key_fingerprint``: the slow fingerprint of this run's API key, kept in ``run.json``; a
    folder whose run was made with another key is refused (``KeyChangedError``) before
    anything is sent (None: a dry run, which sends nothing and needs no key). ``name`` and
    ``input_path``: the run's file name template and input, kept in ``run.json`` for a rerun
    and its resume hint (None: left as recorded)."""

    def __init__(
        self,
        folder: Path,
        *,
        surface: str,
        derive: Callable[[], str] | None = None,
        new_run: bool = False,
        key_fingerprint: str | None = None,
        name: str | None = None,
        input_path: str | None = None,
    ) -> None:
        self.folder = folder
        self.surface = surface
        self.key_fingerprint = key_fingerprint
        self.name = name
        self.input_path = input_path
        self.run = _identity.load(folder)
        _identity.check_key(folder, self.run, key_fingerprint)
        if new_run and self.run is not None:
            raise RequestValidationError(
                "out_dir",
                f"{folder} holds a run already ({_identity.RUN_NAME}): --new-run (new_run=True) "
                "starts one only in a folder without one; use another folder; nothing was sent",
                code="run_exists",
            )
        if self.run is not None:
            self.run_id = self.run.run_id
        elif new_run or derive is None:
            self.run_id = _identity.random_run_id()
        else:
            self.run_id = derive()

    def previous_surface(self) -> str | None:
        return self.run.surface if self.run is not None else None

    def digests(self) -> _identity.LineDigests:
        return _identity.LineDigests(self.folder)

    def accept(self, digests: _identity.LineDigests, input_digest: str) -> None:
        run = self.run
        fingerprint = self.key_fingerprint or (run.key_fingerprint if run is not None else None)
        name = self.name or (run.name if run is not None else None)
        source = self.input_path or (run.input_path if run is not None else None)
        if (
            run is None
            or run.input_digest != input_digest
            or run.surface != self.surface
            or run.key_fingerprint != fingerprint  # a record older than keeping it gets it now
            or (run.name, run.input_path) != (name, source)
        ):
            # Before anything is sent: the keys of every line follow from this run id.
            kept = _identity.RunIdentity(
                self.run_id, input_digest, self.surface, fingerprint, name=name, input_path=source
            )
            _identity.save(self.folder, kept)
            digests.commit()


class _Lines(Protocol):
    """Where the plan puts each line: ``add`` is False when the line repeats an earlier one."""

    def add(self, row: Row) -> bool: ...

    def bad(self, row: Row) -> None: ...


class _Ledgered:
    """Lines into the ledger's plan."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def add(self, row: Row) -> bool:
        return self.ledger.plan_line(row) is not None

    def bad(self, row: Row) -> None:
        self.ledger.plan_line(row)


class _Seen:
    """Lines only checked: ids seen so far, in a temporary SQLite table (a million of them
    need no memory of ours)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("CREATE TABLE ids (identity TEXT PRIMARY KEY)")

    def add(self, row: Row) -> bool:
        if row.identity.startswith("line:"):  # numbered by place: cannot repeat
            return True
        cursor = self.db.execute("INSERT OR IGNORE INTO ids VALUES (?)", (row.identity,))
        return cursor.rowcount != 0

    def bad(self, row: Row) -> None:
        pass


class _BadLines:
    """Every bad line of a plan, written as they come to a temp file in the folder (a million
    of them need no memory), kept whole as ``bad-lines.txt`` when there are more than the
    messages name; a listing left by an earlier run goes."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / BAD_LINES_NAME
        refuse_link(self.path)  # refused before the plan, not after the paid work
        self._tmp = temp_name(self.path)
        self._out: TextIO | None = None

    def add(self, bad: BadLine) -> None:
        if self._out is None:
            self._out = os.fdopen(create_new(self._tmp), "w", encoding="utf-8")
        self._out.write(f"line {bad.line}: {bad.reason}\n")

    def finish(self, count: int) -> Path | None:
        if self._out is not None:
            self._out.close()
        if count <= SHOWN_BAD_LINES:
            self._tmp.unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
            return None
        refuse_link(self.path)
        os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        if self._out is not None and not self._out.closed:
            self._out.close()
        self._tmp.unlink(missing_ok=True)


def new_row(item: InputLine, default_surface: str, run_id: str | None) -> Row:
    """The ledger row of an input line, its key made from the run's id (none for a line that
    collects a task made elsewhere, or when the id is not known yet: a check only)."""
    surface = check_surface(item.surface or default_surface)
    digest = item.digest(default_surface)
    identity = item.identity(default_surface)
    key = None
    if item.kind != COLLECT and run_id is not None:
        key = _identity.idempotency_key(run_id, identity, digest)
    return Row(
        identity=identity,
        line=item.line,
        caller_id=item.caller_id,
        kind=item.kind,
        digest=digest,
        fields=item.fields,
        surface=surface,
        idempotency_key=key,
        task_id=item.task_id,
        state=RUNNING if item.kind == COLLECT else UNKNOWN,
    )


def bad_row(bad: BadLine, surface: str) -> Row:
    """The ledger row of a bad input line: failed, with its reason."""
    return Row(
        identity=f"bad:{bad.line}",
        line=bad.line,
        caller_id=None,
        kind=BAD,
        digest=hashlib.sha256(bad.reason.encode()).hexdigest(),
        fields={},
        surface=surface,
        idempotency_key=None,
        task_id=None,
        state=FAILED,
        error_code=INVALID_LINE,
        error_message=bad.reason,
    )


def _scan(
    source: Any,
    digests: _identity.LineDigests,
    lines: _Lines,
    *,
    surface: str,
    run_id: str | None,
    options: BatchOptions,
    part: Slice,
    listing: _BadLines | None,
    tasks: bool = False,
) -> Plan:
    """The pass itself: every line read, checked, put where ``lines`` says and compared;
    ``tasks``: the input is a list of tasks (``download --from``), not of requests."""
    plan = Plan()
    tally = Tally()
    whole = part.lines is None and not part.sliced
    where = Where(part.lines, part.first_line, part.first_entry, tally, whole)
    items = parse_lines(source, where, collect=tasks, format=options.format)
    for item in items:
        if isinstance(item, InputLine):
            row = new_row(item, surface, run_id)
            if lines.add(row):
                digests.add(item.line, _identity.line_digest(row.identity, row.digest))
                continue
            item = BadLine(item.line, f"{row.identity.split(':', 1)[0]} repeats an earlier line")
        plan.bad_count += 1
        if len(plan.bad) < BAD_LINES_KEPT:
            plan.bad.append(item)
        if listing is not None:
            listing.add(item)
        lines.bad(bad_row(item, surface))
    plan.comments = tally.comments
    plan.input_digest = digests.finish()
    if _changes_bill(tasks):
        plan.changed, plan.changed_count = digests.added, digests.added_count
        plan.removed, plan.removed_count = digests.removed, digests.removed_count
    if listing is not None:
        plan.bad_file = listing.finish(plan.bad_count)
    return plan


def _changes_bill(tasks: bool) -> bool:
    """Whether lines new, changed or removed since the run's record of its input (or a run on
    another surface) are held to ``allow_changes``: a batch's are new requests, billed anew. A
    list of tasks (``download --from``) sends nothing but queries and downloads, so it may grow,
    shrink or name another surface freely, and none of it is reported as a change."""
    return not tasks


def _refuse(plan: Plan, options: BatchOptions) -> None:
    """Stops a plan that may not go: bad lines unless skipped, changed lines unless allowed."""
    if plan.bad_count and not options.skip_bad_lines:
        raise BatchInputError(plan.bad, plan.bad_count, listing=plan.bad_file)
    if plan.changed_count + plan.removed_count and not options.allow_changes:
        raise _identity.InputChangedError(
            plan.changed,
            plan.changed_count,
            removed=plan.removed,
            removed_count=plan.removed_count,
        )


def plan_run(
    source: Any,
    folder: Path,
    ledger: Ledger,
    identity: IdentityStore,
    *,
    surface: str,
    options: BatchOptions,
    part: Slice = WHOLE,
    dry: Callable[[Ledger, Plan], None] | None = None,
    tasks: bool = False,
) -> Plan:
    """Plans a run (or a shard) into its ledger, in one transaction that commits only if the
    run may go: no bad line (unless skipped), no changed line and no other surface than the
    run's (unless allowed). Then the identity store keeps the input's record and the ledger
    moves back what a second look may mend (``Ledger.recheck``). Blocking: run it in a worker
    thread. ``dry``: a dry run: every check, then ``dry`` sees the planned ledger, and nothing
    is kept (the transaction is rolled back, the identity left as it was). ``tasks``: the input
    lists tasks made elsewhere (the driver ``collect_tasks`` says so), never submitted."""
    plan_surface = identity.previous_surface()
    if plan_surface is None and isinstance(identity, FolderIdentity):
        # A run.json written before runs kept their surface: the ledger tells it.
        kept = ledger.last_surfaces()
        plan_surface = kept.pop() if len(kept) == 1 else None
    moved = plan_surface is not None and plan_surface != surface and _changes_bill(tasks)
    if moved and not options.allow_changes:  # every line a new request: one fact, not a list
        assert plan_surface is not None
        raise _identity.InputChangedError([], 0, surfaces=(plan_surface, surface))
    digests = identity.digests()
    listing = _BadLines(folder)
    ledger.begin_plan()
    ok = False
    try:
        plan = _scan(
            source,
            digests,
            _Ledgered(ledger),
            surface=surface,
            run_id=identity.run_id,
            options=options,
            part=part,
            listing=listing,
            tasks=tasks,
        )
        if moved:
            plan.previous_surface = plan_surface
        _refuse(plan, options)
        if not options.template.is_default:  # every line's files their own, or none is sent
            options.template.check(ledger.iter_rows())
        ledger.recheck()
        if dry is not None:
            dry(ledger, plan)
        else:
            identity.accept(digests, plan.input_digest)
            ok = True
    except (OSError, sqlite3.Error) as exc:  # a full or failing disk, while planning
        raise storage_error(folder, exc) from exc
    finally:
        ledger.end_plan(commit=ok)
        digests.discard()
        listing.discard()
    return plan


@dataclass
class Scan:
    """A check of a whole input against a record: the plan, and the comparison (whose new
    entries become the run's ``lines.fp`` when the input is accepted). ``discard`` it after."""

    plan: Plan
    digests: _identity.LineDigests

    def discard(self) -> None:
        self.digests.discard()


def scan_input(
    source: str | Path | Iterable[Any],
    work: Path,
    *,
    surface: str,
    record: Path | None,
    options: BatchOptions,
    refuse: bool = True,
) -> Scan:
    """Checks an input with no ledger: bad and repeated lines, and its lines against the record
    of a run's input at ``record`` (None: every line is new). With ``refuse``, a plan that may
    not go raises as a run's would. Blocking. What the Dask driver checks before dispatching
    anything, and what a shard that makes a run's identity publishes."""
    nothing = work / f".no-record.{secrets.token_hex(16)}"  # compared with no record
    digests = _identity.LineDigests(work, old=record if record is not None else nothing)
    seen_path = work / f".ids.{secrets.token_hex(16)}.sqlite"
    try:
        with closing(sqlite3.connect(seen_path)) as db:
            plan = _scan(
                source,
                digests,
                _Seen(db),
                surface=surface,
                run_id=None,
                options=options,
                part=WHOLE,
                listing=None,
            )
        if refuse:
            _refuse(plan, options)
    except BaseException:
        digests.discard()
        raise
    finally:
        seen_path.unlink(missing_ok=True)
    return Scan(plan, digests)
