"""Reading a batch's input, one line at a time (a file of a million lines never sits in memory).

A line is either a request to generate (``prompt``, optional ``aspect_ratio``, ``resolution``,
``surface``, ``id``) or, with ``task_id`` (and an optional ``surface``), a task made elsewhere to
collect: it is never submitted, only waited on and downloaded, and its other fields are kept for
the manifest. Files ending in ``.jsonl``/``.ndjson`` hold one JSON object a line; ``.csv`` and
``.tsv`` files are CSV (RFC 4180: a header row naming the columns, quoted fields, the separator
told by the header: a tab or a comma); ``.json`` files and standard input are read line by line,
a JSON object a record and any other line a prompt; any other file holds one prompt a line, and
one whose every line is a JSON object, or that looks like CSV (a header row, or the same number
of commas or tabs on every line), is refused (each line would be billed as literal text).
``format="jsonl"``, ``"csv"`` or ``"text"`` says it outright. Blank lines are skipped, and so
are comments: a line whose first character is ``#`` followed by whitespace or by nothing
(``#hashtag sunset`` is a prompt); CSV has neither. ``collect=True`` reads a list of tasks
instead: bare task ids or JSON objects with ``task_id``, so what ``imggw --json submit`` prints,
and a batch's ``manifest.jsonl``, pipe straight in (its rows of lines that never had a task are
left out: there is nothing to collect).
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import sys
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from .._config import SURFACES
from .._core import jsonio, rules
from .._core.text import printable
from .._exceptions import ImggwError, RequestValidationError
from .._models import ImageRequest

JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIX = ".json"  # JSONL by another name, or prompts: told line by line
CSV_SUFFIXES = (".csv", ".tsv")
TSV_SUFFIX = ".tsv"  # a header of one column says no separator: the name does
FORMATS = ("jsonl", "text", "csv")
# How lines are read: one JSON value a line; a prompt a line; a prompt a line, refused whole
# if every line is a JSON object or it looks like CSV; a JSON object a line where one begins,
# else a prompt (refused whole if it looks like CSV); CSV records under a header row.
_JSONL, _TEXT, _TEXT_CHECKED, _AUTO, _CSV = "jsonl", "text", "text-checked", "auto", "csv"
CSV_COLUMNS = ("prompt", "aspect_ratio", "resolution", "surface", "id")
SHOWN_BAD_LINES = 10  # bad lines an error names; more go to a file in the output folder
BAD_LINES_NAME = "bad-lines.txt"
GENERATE, COLLECT = "generate", "collect"
_REQUEST_FIELDS = set(CSV_COLUMNS)
# What a collect line may carry besides task_id: what submit/status/poll print, a manifest's
# fields, and the request it came from (kept for the manifest and the gallery).
_COLLECT_FIELDS = {
    "task_id", "surface", "id", "prompt", "aspect_ratio", "resolution", "idempotency_key",
    "line", "status", "progress", "image_urls", "error", "files", "cost", "credits",
    "expires_at",
}  # fmt: skip
_KEPT = ("prompt", "aspect_ratio", "resolution")
MAX_LINE_CHARS = 1 << 20  # a prompt is at most 20,000 characters; a longer line is not input


@dataclass(frozen=True, slots=True)
class InputLine:
    """One line of work: its 1-based line number (a CSV record's first line), the caller's
    id if any, and either the request to generate or the task to collect (``task_id``), with
    the ``surface`` it runs on if the line names one. ``fields`` keeps the request's text for
    the manifest and the gallery. ``entry`` counts the input's lines that are neither blank nor
    comments (bad ones included; a CSV file's records, its header not one): a line with no id
    is known by it, so a comment or blank line added anywhere changes no line's identity (nor
    its key)."""

    line: int
    request: ImageRequest | None = None
    caller_id: str | None = None
    task_id: str | None = None
    surface: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    entry: int = 0

    @property
    def kind(self) -> str:
        return COLLECT if self.task_id is not None else GENERATE

    def identity(self, default_surface: str) -> str:
        """What ties this line to its ledger row across runs: the caller's id, else the task a
        collect line names on its surface (so naming it twice is caught, with or without the
        surface spelled out), else its entry number."""
        if self.caller_id is not None:
            return f"id:{self.caller_id}"
        if self.task_id is not None:
            return f"task:{self.surface or default_surface}:{self.task_id}"
        return f"line:{self.entry or self.line}"

    def digest(self, surface: str) -> str:
        """What the line asks for, on the surface it runs on: a new digest is a new
        request (and a new idempotency key)."""
        if self.request is not None:
            r = self.request
            what: list[str] = [GENERATE, r.prompt, r.aspect_ratio, r.resolution.lower(),
                               self.surface or surface]  # fmt: skip
        else:
            what = [COLLECT, self.task_id or "", self.surface or surface]
        return hashlib.sha256(json.dumps(what, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class BadLine:
    line: int
    reason: str


class BatchInputError(ImggwError):
    """The input has bad lines and the batch was told to stop on them, or is not in the format
    it is read in; nothing was sent.

    ``bad_lines`` holds the first ones found (up to 1,000); ``count`` how many there are. The
    message names up to 10; ``listing``, when set, is the file that lists every one (line
    number and reason, one a line: ``bad-lines.txt`` in the output folder).

    Example::

        except BatchInputError as err:
            for bad in err.bad_lines:
                print(f"line {bad.line}: {bad.reason}")
    """

    def __init__(
        self,
        bad_lines: list[BadLine],
        count: int | None = None,
        *,
        listing: str | Path | None = None,
        message: str | None = None,
    ) -> None:
        total = len(bad_lines) if count is None else count
        if message is None:
            message = describe_bad_lines(bad_lines, total, listing) + "; nothing was sent"
        super().__init__(message, code="invalid_input")
        self.bad_lines = bad_lines
        self.count = total
        self.listing = None if listing is None else Path(listing)


def describe_bad_lines(bad_lines: list[BadLine], count: int, listing: str | Path | None) -> str:
    """``line 2: not a JSON object``, or for several the first 10 and where the rest are."""
    if count == 1 and bad_lines:
        return f"line {bad_lines[0].line}: {bad_lines[0].reason}"
    shown = "; ".join(f"line {b.line}: {b.reason}" for b in bad_lines[:SHOWN_BAD_LINES])
    text = f"{count} bad lines: {shown}"
    if count > SHOWN_BAD_LINES:
        rest = count - SHOWN_BAD_LINES
        text += f"; all {count} are listed in {listing}" if listing else f" (and {rest} more)"
    return text


def read_lines(
    source: str | Path | Iterable[Any], *, collect: bool = False, format: str | None = None
) -> tuple[list[InputLine], list[BadLine]]:
    """Every line of ``source`` at once: the good ones and the bad ones (for small inputs and
    tests; the runner streams with :func:`iter_lines`).

    Example::

        lines, bad = read_lines("prompts.jsonl")
    """
    lines: list[InputLine] = []
    bad: list[BadLine] = []
    for item in iter_lines(source, collect=collect, format=format):
        if isinstance(item, InputLine):
            lines.append(item)
        else:
            bad.append(item)
    return lines, bad


@dataclass
class Tally:
    """What a pass over an input skipped and counted besides its lines: ``comments``."""

    comments: int = 0


def iter_lines(
    source: str | Path | Iterable[Any] | TextIO,
    *,
    collect: bool = False,
    format: str | None = None,
    lines: range | None = None,
    first_line: int = 1,
    first_entry: int = 1,
) -> Iterator[InputLine | BadLine]:
    """Each line of ``source`` in order, parsed: a file path (``-`` or a text stream for
    standard input), or an iterable of ``ImageRequest``, dicts or strings (position = line
    number). Repeated caller ids are not checked here: the ledger refuses them.

    ``format`` is ``"jsonl"`` (a JSON object a line), ``"csv"`` (a header row naming columns
    among ``prompt``, ``aspect_ratio``, ``resolution``, ``surface`` and ``id``, then a record
    a row; RFC 4180 quoting; comma- or tab-separated, as the header is), ``"text"`` (a prompt
    a line) or None: told by the file's name (``.jsonl``, ``.ndjson``: JSONL; ``.csv``,
    ``.tsv``: CSV), else line by line for ``.json`` files and standard input (a line that
    begins with ``{`` is a JSON object, any other line a prompt as written, ``"Hello," said
    the fox`` and ``[cinematic] a fox`` included), else text. Read as text without ``"text"``
    said, an input whose every line is a JSON object, whose first line is a CSV header row or
    whose every line holds the same number of commas (or tabs) raises
    :class:`BatchInputError` (each line would be billed as literal text). ``collect`` lists
    are read as they always were, whatever the format.

    ``lines`` keeps only the lines whose numbers it holds (a shard's range: the others are
    skipped unparsed; a CSV record belongs where it begins); ``first_line`` and
    ``first_entry`` are the numbers of the source's first line and entry (a shard's slice of
    a larger input keeps its lines' numbers; a CSV slice begins with the header row).

    Example::

        for item in iter_lines("prompts.csv"):
            print(item)
    """
    whole = lines is None and first_line == 1 and first_entry == 1
    return parse_lines(source, collect=collect, format=format, lines=lines,
                       first_line=first_line, first_entry=first_entry, whole=whole)  # fmt: skip


def parse_lines(
    source: str | Path | Iterable[Any] | TextIO,
    *,
    collect: bool = False,
    format: str | None = None,
    lines: range | None = None,
    first_line: int = 1,
    first_entry: int = 1,
    tally: Tally | None = None,
    whole: bool = True,
) -> Iterator[InputLine | BadLine]:
    """:func:`iter_lines`, counting what it skips into ``tally`` (the plan's pass). ``whole``:
    the source is a whole input, not a range or a slice of one, so text read without being
    told is checked whole (a slice of a good input may look like a table)."""
    if format is not None and format not in FORMATS:
        raise RequestValidationError(
            "format", "must be 'jsonl', 'csv' or 'text' (or None: by the name)"
        )
    found = tally if tally is not None else Tally()
    where = _Where(lines, first_line, first_entry, found, whole and lines is None)
    items = _raw_items(source, collect, format, where)
    for number, entry, item in items:
        try:
            parsed = _parse_collect(number, item) if collect else _parse(number, item)
        except _Bad as problem:
            yield BadLine(number, str(problem))
        else:
            if parsed is not None:  # None: a record of a line that never had a task
                yield replace(parsed, entry=entry)


def is_comment(stripped: str) -> bool:
    """Whether a line (its surrounding whitespace stripped) is a comment: ``#`` followed by
    whitespace or by nothing. ``#hashtag sunset`` and ``#1 bestseller`` are prompts.

    Example::

        assert is_comment("# a note") and not is_comment("#hashtag sunset")
    """
    return stripped[:1] == "#" and (len(stripped) == 1 or stripped[1].isspace())


def _mode(collect: bool, format: str | None, suffix: str | None) -> str:
    """How a text source's lines are read; ``suffix`` is a file's (None: a stream)."""
    if collect or format == "jsonl":
        return _JSONL
    if format == "text":
        return _TEXT
    if format == "csv":
        return _CSV
    if suffix is None or suffix == JSON_SUFFIX:
        return _AUTO
    if suffix in CSV_SUFFIXES:
        return _CSV
    return _JSONL if suffix in JSONL_SUFFIXES else _TEXT_CHECKED


def reads_csv(source: str | Path, *, collect: bool = False, format: str | None = None) -> bool:
    """Whether ``source`` (a file) is read as CSV: its slices then begin with its header."""
    return _mode(collect, format, Path(source).suffix.lower()) == _CSV


def _raw_items(
    source: Any, collect: bool, format: str | None, where: _Where
) -> Iterator[tuple[int, int, Any]]:
    if isinstance(source, (str, Path)) and str(source) == "-":
        yield from _stdin_items(_mode(collect, format, None), where)
        return
    if isinstance(source, io.TextIOBase) or hasattr(source, "readline"):
        yield from _handle_items(source, _mode(collect, format, None), where, "the input")
        return
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            # utf-8-sig: a byte-order mark some editors write is not part of the first line.
            handle = path.open(encoding="utf-8-sig", newline="")
        except OSError as exc:
            raise RequestValidationError("source", f"cannot read {path}: {exc.strerror}") from exc
        with handle:
            suffix = path.suffix.lower()
            mode = _mode(collect, format, suffix)
            try:
                yield from _handle_items(handle, mode, where, str(path), tab=suffix == TSV_SUFFIX)
            except UnicodeDecodeError as exc:
                raise RequestValidationError(
                    "source", f"cannot read {path}: not UTF-8 text ({exc.reason})"
                ) from exc
        return
    for offset, item in enumerate(source):
        number = where.first_line + offset
        if where.lines is None or number in where.lines:
            yield number, where.first_entry + offset, item


@dataclass(frozen=True)
class _Where:
    """The part of a source read and how it is numbered (see :func:`iter_lines`), the tally
    the pass counts into, and whether it is a whole input (see :func:`parse_lines`)."""

    lines: range | None
    first_line: int
    first_entry: int
    tally: Tally
    whole: bool


def _handle_items(
    handle: Any, mode: str, where: _Where, name: str, *, tab: bool = False
) -> Iterator[tuple[int, int, Any]]:
    if mode == _CSV:
        return _csv_items(handle, where, name, tab)
    return _text_items(handle, mode, where, name)


def _stdin_items(mode: str, where: _Where) -> Iterator[tuple[int, int, Any]]:
    """Standard input, read as bytes and decoded as a file is (UTF-8, a byte-order mark
    dropped, lines cut alike) whatever the terminal's encoding, so that input that is not
    UTF-8 is one clear error."""
    name = "standard input"
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream in its place (embedding): already decoded
        yield from _handle_items(sys.stdin, mode, where, name)
        return
    handle = io.TextIOWrapper(buffer, encoding="utf-8-sig", newline="")
    try:
        yield from _handle_items(handle, mode, where, name)
    except UnicodeDecodeError as exc:
        raise RequestValidationError(
            "source", f"cannot read standard input: not UTF-8 text ({exc.reason})"
        ) from exc
    finally:
        handle.detach()  # sys.stdin's own buffer stays open


def _text_items(handle: Any, mode: str, where: _Where, name: str) -> Iterator[tuple[int, int, Any]]:
    # Every mode decides a line by that line alone, so input streams through in bounded
    # memory; only the checks of text read without being told (every line a JSON object? the
    # same separators on every line?) wait for its end, and they keep a few numbers, not the
    # lines: nothing is sent before the whole input is read.
    lines = where.lines
    entry = where.first_entry - 1
    read = 0
    checked = mode in (_TEXT_CHECKED, _AUTO) and where.whole
    all_objects = checked and mode == _TEXT_CHECKED
    looks = _LooksLikeCsv() if checked else None
    for number, raw in enumerate(handle, start=where.first_line):
        if lines is not None and number >= lines.stop:
            break  # a range is contiguous: nothing of it comes later
        raw = raw.rstrip("\r\n")
        stripped = raw.strip()
        if not stripped:
            continue
        if is_comment(stripped):
            if lines is None or number in lines:
                where.tally.comments += 1
            continue
        entry += 1  # counted before the range too: entries are numbered over the whole input
        if checked and entry == 1 and stripped[0] != "{" and _is_csv_header(stripped):
            raise BatchInputError([], 0, message=_header_message(name, number, stripped))
        if lines is not None and number not in lines:
            continue
        read += 1
        if len(raw) > MAX_LINE_CHARS:
            all_objects = False
            looks = None
            yield number, entry, _Unreadable(f"longer than {MAX_LINE_CHARS} characters")
            continue
        if looks is not None:
            if stripped[0] == "{" and mode == _AUTO:
                looks = None  # records among the lines: written line by line, not a table
            else:
                looks.add(raw)
        if mode in (_TEXT, _TEXT_CHECKED):
            if all_objects:
                all_objects = stripped[0] == "{" and _is_object(stripped)
            yield number, entry, raw
        elif mode == _AUTO:
            # A line that begins with { was meant as a record: broken, it is a bad line, not
            # a prompt billed as literal JSON. Any other line is a prompt as written.
            yield number, entry, _load(stripped, _AUTO_HINT) if stripped[0] == "{" else raw
        elif stripped[0] in '{["':
            yield number, entry, _load(stripped)
        else:
            yield number, entry, _Bare(stripped)
    if all_objects and read:
        raise BatchInputError(
            [],
            0,
            message=f"{name} is read as text, a prompt a line, but every line of it is a JSON "
            "object (JSON Lines): each would be billed as literal JSON text. Pass --format "
            "jsonl (format='jsonl') or name it .jsonl; --format text sends the lines as "
            "prompts; nothing was sent",
        )
    table = looks.separators() if looks is not None else None
    if table is not None:
        count, separator = table
        raise BatchInputError(
            [],
            0,
            message=f"{name} is read as text, a prompt a line, but every line of it holds "
            f"{count} {separator}{'s' if count > 1 else ''}, as the rows of a CSV table do: "
            "each line would be billed as literal text. Pass --format csv (format='csv') to "
            "read it as CSV, its first row naming the columns (prompt, aspect_ratio, "
            "resolution, surface, id), or --format text to send every line as a prompt; "
            "nothing was sent",
        )


class _LooksLikeCsv:
    """Whether every line seen holds the same number (at least one) of commas, or of tabs,
    and there is more than one: the rows of a table, not prompts."""

    def __init__(self) -> None:
        self.lines = 0
        self.commas: int | None = None
        self.tabs: int | None = None

    def add(self, raw: str) -> None:
        commas, tabs = raw.count(","), raw.count("\t")
        if self.lines == 0:
            self.commas, self.tabs = commas, tabs
        else:
            if self.commas != commas:
                self.commas = None
            if self.tabs != tabs:
                self.tabs = None
        self.lines += 1

    def separators(self) -> tuple[int, str] | None:
        """How many of which separator every line holds, if it is a table."""
        if self.lines < 2:
            return None
        if self.tabs:
            return self.tabs, "tab"
        if self.commas:
            return self.commas, "comma"
        return None


def _is_csv_header(line: str) -> bool:
    """Whether a line read as text is a header row ``--format csv`` would read: column names
    (any case, maybe quoted) among ours, ``prompt`` one of them, none twice."""
    cells = [c.strip().strip('"').strip().lower() for c in line.split(_separator_of(line))]
    return "prompt" in cells and len(set(cells)) == len(cells) and set(cells) <= _REQUEST_FIELDS


def _separator_of(header: str, *, tab: bool = False) -> str:
    """A header row's separator: a tab if it holds one, else a comma if it holds one; a header
    of one column holds neither, and the file's name says (``.tsv``: a tab)."""
    if "\t" in header:
        return "\t"
    if "," in header:
        return ","
    return "\t" if tab else ","


def _header_message(name: str, number: int, line: str) -> str:
    return (
        f"{name} is read as text, a prompt a line, but its line {number} "
        f"({printable(line, 60)!r}) is the header row of a CSV table: every line would be "
        "billed as literal text, that one too. Pass --format csv (format='csv') or name it "
        ".csv; --format text sends every line as a prompt; nothing was sent"
    )


# ---------------------------------------------------------------------------- CSV


def _csv_items(handle: Any, where: _Where, name: str, tab: bool) -> Iterator[tuple[int, int, Any]]:
    """A CSV source's records (RFC 4180, by Python's csv module), numbered by the line each
    begins on: the header row names the columns; a blank row (or one of empty cells) is
    skipped; a row that is not CSV, or has another number of fields than the header, is a bad
    line. A header that is not ours stops the input whole, whatever ``skip_bad_lines``: no
    row of it could be read."""
    lines = where.lines
    entry = where.first_entry - 1
    header: list[str] | None = None
    for record in _csv_records(handle, tab=tab):
        number = where.first_line + record.start - 1
        if lines is not None and number >= lines.stop:
            break  # a range is contiguous: nothing of it begins later
        if record.blank:
            continue
        if header is None:
            header = _csv_header(record, number, name)
            continue
        entry += 1  # counted before the range too: entries are numbered over the whole input
        if lines is not None and number not in lines:
            continue
        if record.error is not None:
            yield number, entry, _Unreadable(record.error)
        elif len(record.cells) != len(header):
            yield number, entry, _Unreadable(_field_count(record.cells, header))
        else:
            yield number, entry, _csv_fields(header, record.cells)


@dataclass(frozen=True)
class CsvRecord:
    """One record of a CSV source: the line it begins on and the one it ends on (1-based,
    in the source), its cells (or why it is not CSV: ``error``)."""

    start: int
    end: int
    cells: list[str]
    error: str | None = None

    @property
    def blank(self) -> bool:
        """No cell holds anything: a blank line, or a spreadsheet's row of empty cells."""
        return self.error is None and not any(cell.strip() for cell in self.cells)


def _csv_records(handle: Iterable[str], *, tab: bool = False) -> Iterator[CsvRecord]:
    """Every record of a CSV source, its separator told by the first line that holds
    anything (the header row)."""
    lines = iter(handle)
    ahead: list[str] = []
    for raw in lines:
        ahead.append(raw)
        if raw.strip():
            break
    separator = _separator_of(ahead[-1], tab=tab) if ahead else ","
    # strict: a quote out of place is an error, not a guess (RFC 4180).
    reader = csv.reader(itertools.chain(ahead, lines), delimiter=separator, strict=True)
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield CsvRecord(start, reader.line_num, [], _csv_error(exc))
            continue
        yield CsvRecord(start, reader.line_num, cells)


def _csv_error(exc: csv.Error) -> str:
    text = str(exc)
    if "unexpected end of data" in text:
        return "a quoted field that begins on this line is never closed"
    if "field larger than field limit" in text:
        return f"a field is longer than {csv.field_size_limit()} characters"
    return f"not a CSV row ({text})"


def _csv_header(record: CsvRecord, number: int, name: str) -> list[str]:
    """The columns a header row names, or the input refused, naming the line and column."""
    names = [cell.strip().lower() for cell in record.cells]
    problem = None
    if record.error is not None:
        problem = f"the header row is not CSV: {record.error}"
    else:
        for column, column_name in enumerate(names, 1):
            if not column_name:
                problem = f"column {column} of the header row has no name"
            elif column_name not in _REQUEST_FIELDS:
                shown = printable(record.cells[column - 1].strip(), 40)
                problem = f"the header row names an unknown column {shown!r} (column {column})"
            elif names.index(column_name) != column - 1:
                first = names.index(column_name) + 1
                problem = (f"the header row names {column_name!r} twice (columns {first} and "
                           f"{column})")  # fmt: skip
            if problem is not None:
                break
        else:
            if "prompt" not in names:
                problem = "the header row names no prompt column"
    if problem is None:
        return names
    raise BatchInputError(
        [BadLine(number, problem)],
        1,
        message=f"{name}, line {number}: {problem}; the columns are {', '.join(CSV_COLUMNS)} "
        "(prompt required), in any order, named by the first row; nothing was sent",
    )


def _field_count(cells: list[str], header: list[str]) -> str:
    have, want = len(cells), len(header)
    said = f"{have} field{'' if have == 1 else 's'} where the header row names {want}"
    if have < want:
        missing = [f"{n} ({header[n - 1]})" for n in range(have + 1, want + 1)]
        which = "column" if len(missing) == 1 else "columns"
        return f"{said}: {which} {', '.join(missing)} missing"
    return f"{said}: column {want + 1} is not in the header row"


def _csv_fields(header: list[str], cells: list[str]) -> dict[str, str]:
    """A record as a JSON line would give it: an empty cell is the column's default (a
    spreadsheet leaves it blank); the prompt is kept as written, the other cells trimmed."""
    fields: dict[str, str] = {}
    for column, cell in zip(header, cells, strict=True):
        value = cell if column == "prompt" else cell.strip()
        if value.strip():
            fields[column] = value
    return fields


def csv_line_kinds(handle: Iterable[str], *, tab: bool = False) -> Iterator[tuple[str, str]]:
    """Each line of a CSV source and what it is (``HEADER``, ``ENTRY``: a record begins on it,
    ``MORE``: a record that began earlier goes on, ``SKIPPED``: blank): what cutting it into
    slices needs."""
    lines: list[str] = []

    def kept(source: Iterable[str]) -> Iterator[str]:
        for raw in source:
            lines.append(raw)
            yield raw

    header = False
    for record in _csv_records(kept(handle), tab=tab):
        if record.blank:
            kind = SKIPPED
        elif not header:
            header, kind = True, HEADER
        else:
            kind = ENTRY
        yield lines[0], kind
        for raw in lines[1:]:
            yield raw, MORE
        lines.clear()
    for raw in lines:  # pragma: no cover - the reader takes no line without a record
        yield raw, MORE


HEADER, ENTRY, MORE, SKIPPED = "header", "entry", "more", "skipped"


def line_kinds(
    path: str | Path, *, collect: bool = False, format: str | None = None
) -> Generator[tuple[str, str], None, None]:
    """Each line of the file ``path`` (as written, its line break kept) and what it is to
    :func:`iter_lines`: ``ENTRY`` (an entry begins on it), ``SKIPPED`` (blank or a comment),
    and in CSV ``HEADER`` and ``MORE`` (a record that began on an earlier line goes on).
    Blocking; what the Dask driver cuts slices and counts entries with."""
    with Path(path).open(encoding="utf-8-sig", newline="") as handle:
        if reads_csv(path, collect=collect, format=format):
            yield from csv_line_kinds(handle, tab=Path(path).suffix.lower() == TSV_SUFFIX)
            return
        for raw in handle:
            stripped = raw.strip()
            yield raw, ENTRY if stripped and not is_comment(stripped) else SKIPPED


def _is_object(text: str) -> bool:
    try:
        return isinstance(jsonio.loads(text), dict)
    except ValueError:
        return False


_AUTO_HINT = " (a line that begins with { is read as one; --format text reads it as a prompt)"


def _load(text: str, hint: str = "") -> Any:
    """A line's JSON value, or why it has none."""
    try:
        return jsonio.loads(text, unique_keys=True)
    except ValueError:
        repeated = _repeated_key(text)
        if repeated is not None:
            return _Unreadable(f"repeated key {printable(repeated, 40)!r}")
        return _Unreadable("not a JSON object" + hint)


def _repeated_key(text: str) -> str | None:
    """The first key an object of ``text`` repeats, if that is all that is wrong with it."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return found[0] if found else None


class _Unreadable:
    def __init__(self, why: str) -> None:
        self.why = why


class _Bare(str):
    """A line that is not JSON: a prompt in a batch of prompts, a task id in a collect list."""


class _Bad(Exception):
    pass


def _caller_id(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Bad("id must be a string or an integer")
    text = str(value)
    if not text or len(text) > 255 or not text.isprintable():
        raise _Bad("id must be 1 to 255 printable characters")
    return text


def count_lines(path: str | Path) -> int:
    """How many lines ``path`` has, numbered as :func:`iter_lines` numbers them (blank and
    comment lines included): what shards are cut from."""
    try:
        with Path(path).open(encoding="utf-8", newline="") as handle:
            return sum(1 for _ in handle)
    except OSError as exc:
        raise RequestValidationError("source", f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise RequestValidationError(
            "source", f"cannot read {path}: not UTF-8 text ({exc.reason})"
        ) from exc


def _parse(number: int, item: Any) -> InputLine | None:
    if isinstance(item, ImageRequest):
        return InputLine(number, item, fields=_fields(item))
    if isinstance(item, _Unreadable):
        raise _Bad(item.why)
    if isinstance(item, _Bare):  # a JSONL batch: a line that is not JSON is a mistake
        raise _Bad("not a JSON object" + (_COMMENT_HINT if item.startswith("#") else ""))
    if isinstance(item, str):
        item = {"prompt": item}
    if not isinstance(item, dict):
        raise _Bad("not a JSON object")
    if "task_id" in item:
        return _parse_collect(number, item)
    unknown = sorted(set(item) - _REQUEST_FIELDS)
    if unknown:
        raise _Bad(f"unknown field {printable(unknown[0], 40)!r}")
    if "prompt" not in item:
        raise _Bad("prompt is required (or task_id, to collect a task made elsewhere)")
    caller_id = _caller_id(item.get("id"))
    surface = _surface(item.get("surface"))
    try:
        request = ImageRequest(
            item["prompt"], item.get("aspect_ratio", "auto"), item.get("resolution", "1k")
        )
    except RequestValidationError as err:
        raise _Bad(err.message) from None
    return InputLine(number, request, caller_id, surface=surface, fields=_fields(request))


_COMMENT_HINT = " (a comment line begins with '# ': a # and a space)"


def _surface(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in SURFACES:
        raise _Bad(f"surface must be one of {', '.join(SURFACES)}")
    return value


def _parse_collect(number: int, item: Any) -> InputLine | None:
    if isinstance(item, _Unreadable):
        raise _Bad(item.why)
    if isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool)):
        item = {"task_id": str(item)}  # a bare id, or a JSON string or number
    if not isinstance(item, dict):
        raise _Bad("not a task id, nor a JSON object with task_id")
    unknown = sorted(set(item) - _COLLECT_FIELDS)
    if unknown:
        raise _Bad(f"unknown field {printable(unknown[0], 40)!r}")
    task_id = item.get("task_id")
    if task_id is None and "status" in item:
        return None  # a manifest's row of a line that never had a task: nothing to collect
    if task_id is None:
        raise _Bad("task_id is null: this record names no task (never submitted)")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    broken = rules.check_task_id(task_id)
    if broken:
        shown = printable(task_id, 40) if isinstance(task_id, str) else type(task_id).__name__
        raise _Bad(f"task_id {shown!r} is not a task id: it {broken[0].rule}")
    surface = _surface(item.get("surface"))
    kept = {k: item[k] for k in _KEPT if isinstance(item.get(k), str)}
    return InputLine(number, None, _caller_id(item.get("id")), task_id, surface, kept)


def _fields(request: ImageRequest) -> dict[str, str]:
    return {"prompt": request.prompt, "aspect_ratio": request.aspect_ratio,
            "resolution": request.resolution}  # fmt: skip
