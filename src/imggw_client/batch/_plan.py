"""The plan of a run: its options (one type, checked once and passed whole from the entry point
down to the run), what its result files are called, and one pass over its input, before
anything is sent, for every kind of run.

:class:`BatchOptions` is how a batch runs; ``RunOptions`` types the same options as the
keywords the entry points take (``run_batch(..., concurrency=16)``), for type checkers (a test
holds the two together).

Result files' names: ``name=`` (``imggw batch --name``), a template of ``{task_id}``,
``{index}``, ``{line}`` and ``{id}``, rendered into a name safe on any filesystem, and every
line's names checked for collisions before anything is sent. A template holds plain fields
only: a format spec or a conversion (``{line:05}``, ``{id:/^9}``, ``{id!r}``) is refused, since
its fill characters would reach the name unchecked (``/`` makes a path, ESC a control
character). A line's ``id`` is written by whoever wrote the input: it is hostile text. Each
field's value keeps letters, digits, ``-``, ``_`` and ``.`` (others become ``_``); a name never
starts with a dot, never ends with a dot or a space, is never a reserved Windows device name
(``CON``, ``NUL``, ``COM1``...), and is at most :data:`MAX_STEM_BYTES` bytes of UTF-8 (cut at a
character, and given a hash of the whole, so two long ids still get two names): with a surface
prefix and the extension, at most :data:`MAX_NAME_BYTES`, what filesystems allow. The extension
still comes from the content, as ``download`` decides it.

The pass: each line is read and checked (bad lines, repeated ids), given its identity, its
request's digest and its idempotency key (a pure function of the run's identity), and compared
with the record of the input the run was made for (``_identity.LineDigests``), so that a changed
input is refused, unless allowed, before a single request goes out. Where the lines go is the
caller's: a run (or a shard) puts them in its ledger, in one transaction that commits only when
the run may go (:func:`plan_run`); the Dask driver and a shard that makes a run's identity only
check them (:func:`scan_input`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import sqlite3
import string
import threading
import unicodedata
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TextIO, TypedDict

from .._core.config import check_surface
from .._core.exceptions import RequestValidationError
from .._core.text import printable
from .._files import create_new, refuse_link, temp_name
from . import _identity
from ._identity import FolderIdentity, IdentityStore
from ._input import FORMATS, parse_lines
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
from ._schema import BAD, FAILED, RUNNING, UNKNOWN, Row, storage_error

__all__ = [
    "BatchOptions",
    "Caps",
    "DEFAULT_NAME",
    "INCOMING_DIR",
    "LINE_TIMEOUT",
    "MAX_NAME_BYTES",
    "MAX_STEM_BYTES",
    "NameTemplate",
    "Plan",
    "RunOptions",
    "Scan",
    "Slice",
    "WHOLE",
    "plan_run",
    "scan_input",
]


DEFAULT_NAME = "{task_id}-{index}"  # the names results always had: folders resume unchanged
FIELDS = ("task_id", "index", "line", "id")
UNIQUE_FIELDS = ("task_id", "line", "id")  # one of them tells every line's files apart
# Results named by a template land here first, under their task's name, then are renamed into
# place: a name an input's author chose is never where another line's download lands.
INCOMING_DIR = ".incoming"
MAX_NAME_BYTES = 255  # a file name's limit on Linux, macOS and Windows filesystems
# Room for a surface prefix ("alpha-") and an extension (".webp") within MAX_NAME_BYTES.
MAX_STEM_BYTES = MAX_NAME_BYTES - 15
_UNSAFE = re.compile(r"[^\w.-]")  # \w is Unicode letters and digits, and "_"
_DOTS = re.compile(r"\.{2,}")  # never "..", whatever a filesystem makes of it
_LITERAL = re.compile(r"[\w.-]*")
_RESERVED = frozenset(
    ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"]
    + [f"{dev}{n}" for dev in ("COM", "LPT") for n in (*"123456789", "¹", "²", "³")]
)


def _invalid(why: str) -> RequestValidationError:
    return RequestValidationError("name", why, code="invalid_option")


_KNOWN = ", ".join("{" + f + "}" for f in FIELDS)


def _written(field_name: str, conversion: str | None, spec: str | None) -> str:
    """A replacement field as the template wrote it."""
    shown = "{" + field_name
    if conversion:
        shown += "!" + conversion
    if spec:
        shown += ":" + spec
    return shown + "}"


def safe_part(value: str) -> str:
    """A field's value as it may stand in a file name: NFC, and anything but letters, digits,
    ``-``, ``_`` and ``.`` replaced by ``_`` (separators, control characters, NUL, spaces)."""
    return _UNSAFE.sub("_", unicodedata.normalize("NFC", value))


def safe_stem(stem: str) -> str:
    """A rendered name made safe as a whole: no leading dot (hidden, or ``..``), no trailing
    dot or space (Windows drops them), never a device name, at most :data:`MAX_STEM_BYTES`
    bytes of UTF-8 (cut at a character, with a hash of the whole, so distinct names stay
    distinct)."""
    stem = _DOTS.sub(".", stem).lstrip(".").rstrip(". ")
    encoded = stem.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_STEM_BYTES:
        digest = hashlib.sha256(encoded).hexdigest()[:12]
        # A cut inside a character's bytes drops that character: the rest stays valid UTF-8.
        kept = encoded[: MAX_STEM_BYTES - 13].decode("utf-8", "ignore")
        stem = f"{kept.rstrip('. ')}-{digest}"
    if not stem:
        return "_"
    if stem.split(".")[0].upper() in _RESERVED:
        return f"_{stem}"
    return stem


@dataclass(frozen=True)
class NameTemplate:
    """A checked ``name=`` template.

    Without ``{index}``, a task's first result is named by the template alone and its others
    get ``-1``, ``-2``... after it.
    """

    text: str
    fields: frozenset[str]

    @classmethod
    def parse(cls, text: object) -> NameTemplate:
        """The template, or :class:`RequestValidationError` (a field it does not know, a
        format spec or conversion, a path, a template that cannot tell lines apart).
        """
        if not isinstance(text, str) or not text:
            raise _invalid(f"must be a template such as {DEFAULT_NAME!r}")
        used: set[str] = set()
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as err:
            raise _invalid(f"is not a template ({err})") from err
        for literal, field_name, spec, conversion in parsed:
            if not _LITERAL.fullmatch(literal):
                raise _invalid(
                    "is a file name, not a path: outside its fields it may hold only letters, "
                    "digits, '-', '_' and '.'"
                )
            if field_name is None:
                continue
            if field_name not in FIELDS or conversion or spec:
                written = printable(_written(field_name, conversion, spec), 40)
                raise _invalid(
                    f"may use only the plain fields {_KNOWN}, with no format spec or "
                    f"conversion (got {written})"
                )
            used.add(field_name)
        if not used & set(UNIQUE_FIELDS):
            raise _invalid(
                "must hold {task_id}, {line} or {id}: otherwise every line's file has the same name"
            )
        return cls(text, frozenset(used))

    @property
    def is_default(self) -> bool:
        return self.text == DEFAULT_NAME

    def render_fields(self, *, task_id: str, index: int, line: int, caller_id: str) -> str:
        """The stem for these values, made safe (see :func:`safe_stem`)."""
        stem = self.text.format(
            task_id=safe_part(task_id), index=index, line=line, id=safe_part(caller_id)
        )
        if "index" not in self.fields and index:
            stem = f"{stem}-{index}"
        return safe_stem(stem)

    def render(self, row: Row, index: int) -> str:
        """The stem of result ``index`` of the row's task (``{task_id}`` needs its task)."""
        return self.render_fields(
            task_id=row.task_id or "", index=index, line=row.line, caller_id=row.caller_id or ""
        )

    def check(self, rows: Iterable[Row]) -> None:
        """Refuses (:class:`BatchInputError`, nothing sent) lines whose first result would share
        a file with another line's (case folded: macOS and Windows tell no case apart), and
        lines with no ``id`` when the template uses ``{id}``. A template with ``{task_id}``
        cannot collide: task ids are the gateway's, one per task (a task of another surface
        gets that surface's prefix, as the default names do)."""
        bad: list[BadLine] = []
        seen: dict[str, int] = {}
        for row in rows:
            if row.kind == BAD:
                continue
            if "id" in self.fields and row.caller_id is None:
                bad.append(BadLine(row.line, "has no id, and the name template uses {id}"))
                continue
            if "task_id" in self.fields:
                continue
            stem = self.render(row, 0)
            folded = stem.casefold()
            if folded in seen:
                bad.append(BadLine(row.line, f"its file {stem!r} is line {seen[folded]}'s too"))
            else:
                seen[folded] = row.line
        if bad:
            raise BatchInputError(
                bad[:1000],
                len(bad),
                message=_collisions(bad, self.text) + "; nothing was sent",
            )


def _collisions(bad: list[BadLine], text: str) -> str:
    shown = "; ".join(f"line {b.line} {b.reason}" for b in bad[:10])
    more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
    return f"--name {text!r} gives {len(bad)} line(s) no file of their own: {shown}{more}"


LINE_TIMEOUT = 1800.0  # seconds a run waits on one line's task before leaving it for the next


@dataclass(frozen=True)
class Caps:
    """The limits of a run: spend caps (None: none) and the most failed lines."""

    max_credits: float | None = None
    max_cost: float | None = None
    max_failures: int | None = None

    @property
    def spend(self) -> bool:
        return self.max_credits is not None or self.max_cost is not None


class RunOptions(TypedDict, total=False):
    """The keywords of a run (see :class:`BatchOptions` for each one's meaning)."""

    concurrency: int
    timeout: float | None
    surface: str | None
    skip_bad_lines: bool
    allow_changes: bool
    wait: bool
    verify: bool
    gallery: bool
    format: str | None
    new_run: bool
    max_credits: float | None
    max_cost: float | None
    max_failures: int | None
    line_timeout: float | None
    name: str


@dataclass(frozen=True, kw_only=True)
class BatchOptions:
    """How a batch runs.

    - ``concurrency``: submits (and downloads) at once.
    - ``timeout``: seconds the run may take (None: no limit); what is left unfinished is
      resumed by the next run on the same folder.
    - ``surface``: the surface lines run on (default: the client's).
    - ``skip_bad_lines``: report bad input lines and go on (default: refuse the input).
    - ``allow_changes``: run lines new or changed since the folder's run began, as new
      (billed) requests (default: refuse the input).
    - ``wait``: wait for unfinished tasks (``False``: ask each once and report those still
      running, as ``collect_tasks(..., wait=False)`` and ``download --from`` without ``--wait``).
    - ``verify``: check every saved file's sha256 on resume (default: its size).
    - ``gallery``: write ``index.html`` as lines finish and at the end.
    - ``format``: ``"jsonl"``, ``"csv"`` (a header row naming the columns, then a record a
      row) or ``"text"`` (a prompt a line): how a file is read whatever its name says.
    - ``new_run``: a random run id for a folder with no run (new keys, new tasks).
    - ``max_credits``, ``max_cost``: what the folder's run may be charged in all, across reruns
      (and shards: see ``run_shard``); a run that reaches a cap stops submitting, finishes what
      it sent, and ends with ``stopped_by`` (exit 6). ``max_failures``: stop submitting once
      this many lines failed in this run.
    - ``line_timeout``: seconds this run waits on one line's task (default 1800; None: no
      limit). A task still running then is left ``running``, with its key, for the next run;
      the run ends (exit 3) once every other line is final, so that no run (and no lock on
      its folder) lasts forever. Retries of a line's submit or download stop as soon, too.
    - ``name``: the result files' names, a template of the plain fields ``{task_id}``,
      ``{index}``, ``{line}`` (the input line's number) and ``{id}`` (the line's ``id``), with
      no format spec or conversion; default ``{task_id}-{index}``. Made safe for any
      filesystem, at most 255 bytes; lines whose files would share a name are refused before
      anything is sent; a name the folder cannot take once the result is paid for leaves the
      file its default name (the manifest row's ``warning`` says so). The extension comes from
      the content.

    Example::

        options = BatchOptions(concurrency=16, timeout=3600, name="{line}-{task_id}")
        run_batch("prompts.jsonl", "out/", **options.as_keywords())
    """

    concurrency: int = 8
    timeout: float | None = None
    surface: str | None = None
    skip_bad_lines: bool = False
    allow_changes: bool = False
    wait: bool = True
    verify: bool = False
    gallery: bool = True
    format: str | None = None
    new_run: bool = False
    max_credits: float | None = None
    max_cost: float | None = None
    max_failures: int | None = None
    line_timeout: float | None = LINE_TIMEOUT
    name: str = DEFAULT_NAME

    def __post_init__(self) -> None:
        concurrency = self.concurrency
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise RequestValidationError(
                "concurrency", "must be an integer >= 1", code="invalid_concurrency"
            )
        timeout = self.timeout
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise RequestValidationError(
                "timeout",
                "must be a finite number of seconds >= 0, or None for no limit",
                code="invalid_option",
            )
        if self.surface is not None:
            check_surface(self.surface)
        if self.format is not None and self.format not in FORMATS:
            raise RequestValidationError(
                "format", f"must be one of {', '.join(FORMATS)}, or None", code="invalid_option"
            )
        if self.line_timeout is not None and not _positive(self.line_timeout):
            raise RequestValidationError(
                "line_timeout",
                "must be a finite number of seconds > 0, or None for no limit",
                code="invalid_option",
            )
        for name in ("max_credits", "max_cost"):
            cap = getattr(self, name)
            if cap is not None and not _positive(cap):
                raise RequestValidationError(
                    name, "must be a number > 0, or None for no cap", code="invalid_option"
                )
        failures = self.max_failures
        if failures is not None and (
            isinstance(failures, bool) or not isinstance(failures, int) or failures < 1
        ):
            raise RequestValidationError(
                "max_failures",
                "must be an integer >= 1, or None for no limit",
                code="invalid_option",
            )
        NameTemplate.parse(self.name)
        for name in ("skip_bad_lines", "allow_changes", "wait", "verify", "gallery", "new_run"):
            if not isinstance(getattr(self, name), bool):
                raise RequestValidationError(name, "must be True or False", code="invalid_option")

    @classmethod
    def of(cls, options: RunOptions | dict[str, Any]) -> BatchOptions:
        """The options the keywords name; an unknown keyword is one clear error.

        Example::

            BatchOptions.of({"concurrency": 4})
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            names = ", ".join(sorted(known))
            raise RequestValidationError(
                unknown[0],
                f"is not an option of a batch run (they are: {names})",
                code="invalid_option",
            )
        return cls(**options)

    @property
    def caps(self) -> Caps:
        """The run's guards (spend caps, failures)."""
        return Caps(self.max_credits, self.max_cost, self.max_failures)

    @property
    def template(self) -> NameTemplate:
        """The result files' name template, checked."""
        return NameTemplate.parse(self.name)

    @property
    def seconds(self) -> float:
        """The run's time budget: ``timeout``, or no end."""
        return math.inf if self.timeout is None else float(self.timeout)

    def as_keywords(self) -> dict[str, Any]:
        """The options as the entry points' keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _positive(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


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


class _Lines(Protocol):
    """Where the plan puts each line: ``add`` is False when the line repeats an earlier one."""

    def add(self, row: Row) -> bool: ...

    def bad(self, row: Row) -> None: ...


class _Stopped(Exception):
    """A plan told to stop (its run was cancelled) before its next line; nothing is kept."""


class _Ledgered:
    """Lines into the ledger's plan, unless ``stop`` is set."""

    def __init__(self, ledger: Ledger, stop: threading.Event | None) -> None:
        self.ledger, self.stop = ledger, stop

    def add(self, row: Row) -> bool:
        if self.stop is not None and self.stop.is_set():
            raise _Stopped
        return self.ledger.plan_line(row) is not None

    def bad(self, row: Row) -> None:
        self.add(row)


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
        before = self.db.total_changes  # not rowcount: -1 for an INSERT in a Turkish locale
        self.db.execute("INSERT OR IGNORE INTO ids VALUES (?)", (row.identity,))
        return self.db.total_changes != before

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
    stop: threading.Event | None = None,
) -> Plan:
    """Plans a run (or a shard) into its ledger, in one transaction that commits only if the
    run may go: no bad line (unless skipped), no changed line and no other surface than the
    run's (unless allowed). Then the identity store keeps the input's record and the ledger
    moves back what a second look may mend (``Ledger.recheck``). Blocking: run it in a worker
    thread. ``dry``: a dry run: every check, then ``dry`` sees the planned ledger, and nothing
    is kept (the transaction is rolled back, the identity left as it was). ``tasks``: the input
    lists tasks made elsewhere (the driver ``collect_tasks`` says so), never submitted.
    ``stop``: set, the plan stops (raises) at its next line."""
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
    # A dry run leaves the folder as it was: no listing written, none an earlier run left gone.
    listing = _BadLines(folder) if dry is None else None
    ledger.begin_plan()
    ok = False
    try:
        plan = _scan(
            source,
            digests,
            _Ledgered(ledger, stop),
            surface=surface,
            run_id=identity.run_id,
            options=options,
            part=part,
            listing=listing,
            tasks=tasks,
        )
        if moved:
            plan.previous_surface = plan_surface
        if ledger.replaced and not plan.changed_count and _changes_bill(tasks):
            # Lines whose tasks were paid for, asking for something else now, with no record of
            # the input to say so (a folder of the first format, a lines.fp deleted).
            plan.changed, plan.changed_count = (
                ledger.replaced[:BAD_LINES_KEPT],
                len(ledger.replaced),
            )
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
        if listing is not None:
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
