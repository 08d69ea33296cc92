"""Reading a batch's input, one line at a time (a file of a million lines never sits in memory).

A line is either a request to generate (``prompt``, optional ``aspect_ratio``, ``resolution``,
``surface``, ``id``) or, with ``task_id`` (and an optional ``surface``), a task made elsewhere to
collect: it is never submitted, only waited on and downloaded, and its other fields are kept for
the manifest. Files ending in ``.jsonl``/``.ndjson`` hold one JSON object a line; ``.csv`` and
``.tsv`` files are CSV (RFC 4180, by Python's ``csv`` module: a header row naming the columns
``prompt``, ``aspect_ratio``, ``resolution``, ``surface``, ``id`` in any order, quoted fields,
the separator told by the header: a tab or a comma; a record a row, numbered by the line it
begins on); ``.json`` files and standard input are read line by line, a JSON object a record and
any other line a prompt; any other file holds one prompt a line, and one whose every line is a
JSON object, or that looks like CSV (a header row of our columns, or a column of request fields
on every line, such as ``a cat,1:1,1k``), is refused (each line would be billed as literal
text); commas alone make no table (``a cat, watercolor`` is a prompt). ``format="jsonl"``,
``"csv"`` or ``"text"`` says it outright. Blank lines are skipped, and so are comments: a line
whose first character is ``#`` followed by whitespace or by nothing (``#hashtag sunset`` is a
prompt); CSV has neither. ``collect=True`` reads a list of tasks instead: bare task ids or JSON
objects with ``task_id``, so what ``imggw --json submit`` prints, and a batch's
``manifest.jsonl``, pipe straight in (its rows of lines that never had a task are left out:
there is nothing to collect).

This module finds the records (files, standard input, iterables; text read line by line, CSV
by rows); ``_lines`` says what each record asks for and holds what they yield.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import sys
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from .._core.exceptions import RequestValidationError
from .._core.rules import ASPECT_RATIOS, RESOLUTIONS, SURFACES
from .._core.text import printable
from ._lines import (
    AUTO_HINT,
    CSV_COLUMNS,
    ENTRY,
    HEADER,
    MORE,
    REQUEST_FIELDS,
    SKIPPED,
    Bad,
    BadLine,
    Bare,
    BatchInputError,
    InputLine,
    Tally,
    Unreadable,
    Where,
    is_comment,
    is_object,
    load,
    parse,
    parse_collect,
)

JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIX = ".json"  # JSONL by another name, or prompts: told line by line
CSV_SUFFIXES = (".csv", ".tsv")
TSV_SUFFIX = ".tsv"  # a header of one column says no separator: the name does
FORMATS = ("jsonl", "text", "csv")
# How lines are read: one JSON value a line; a prompt a line; a prompt a line, refused whole
# if every line is a JSON object or it looks like CSV; a JSON object a line where one begins,
# else a prompt (refused whole if it looks like CSV); CSV records under a header row.
_JSONL, _TEXT, _TEXT_CHECKED, _AUTO, _CSV = "jsonl", "text", "text-checked", "auto", "csv"
MAX_LINE_CHARS = 1 << 20  # a prompt is at most 20,000 characters; a longer line is not input


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
    that has a column (split at tabs, or at commas) of request fields on every line (aspect
    ratios, resolutions, surfaces) raises :class:`BatchInputError` (each line would be billed
    as literal text); prompts with commas are prompts. ``collect`` lists
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
    where = Where(lines, first_line, first_entry, Tally(), whole)
    return parse_lines(source, where, collect=collect, format=format)


def parse_lines(
    source: str | Path | Iterable[Any] | TextIO,
    where: Where,
    *,
    collect: bool = False,
    format: str | None = None,
) -> Iterator[InputLine | BadLine]:
    """:func:`iter_lines` over the part of ``source`` that ``where`` says, counting what it
    skips into ``where.tally`` (the plan's pass). ``where.whole``: the source is a whole input,
    not a range or a slice of one, so text read without being told is checked whole (a slice
    of a good input may look like a table)."""
    if format is not None and format not in FORMATS:
        raise RequestValidationError(
            "format", "must be 'jsonl', 'csv' or 'text' (or None: by the name)"
        )
    items = _raw_items(source, collect, format, where)
    for number, entry, item in items:
        try:
            parsed = parse_collect(number, item) if collect else parse(number, item)
        except Bad as problem:
            yield BadLine(number, str(problem))
        else:
            if parsed is not None:  # None: a record of a line that never had a task
                yield replace(parsed, entry=entry)


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
    source: Any, collect: bool, format: str | None, where: Where
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


def _handle_items(
    handle: Any, mode: str, where: Where, name: str, *, tab: bool = False
) -> Iterator[tuple[int, int, Any]]:
    if mode == _CSV:
        return csv_items(handle, where, name, tab)
    return _text_items(handle, mode, where, name)


def _stdin_items(mode: str, where: Where) -> Iterator[tuple[int, int, Any]]:
    """Standard input, read as bytes and decoded as a file is (UTF-8, a byte-order mark
    dropped, lines cut alike) whatever the terminal's encoding, so that input that is not
    UTF-8 is one clear error."""
    name = "standard input"
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream in its place (embedding): already decoded
        yield from _handle_items(sys.stdin, mode, where, name)
        return
    with contextlib.suppress(OSError, ValueError):
        # A reader of its own over the descriptor: a run stopped while this read waits on an
        # idle pipe leaves it blocked, and the interpreter's exit then needs sys.stdin's lock.
        buffer = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
    handle = io.TextIOWrapper(buffer, encoding="utf-8-sig", newline="")
    try:
        yield from _handle_items(handle, mode, where, name)
    except UnicodeDecodeError as exc:
        raise RequestValidationError(
            "source", f"cannot read standard input: not UTF-8 text ({exc.reason})"
        ) from exc
    finally:
        handle.detach()  # the descriptor (and sys.stdin's own buffer) stay open
        if buffer is not sys.stdin.buffer:
            buffer.close()  # its own reader, over the descriptor it leaves open


def _text_items(handle: Any, mode: str, where: Where, name: str) -> Iterator[tuple[int, int, Any]]:
    # Every mode decides a line by that line alone, so input streams through in bounded
    # memory; only the checks of text read without being told (every line a JSON object? a
    # column of request fields on every line?) wait for its end, and they keep a few numbers
    # and the first line's cells, not the lines: nothing is sent before the whole input is read.
    lines = where.lines
    entry = where.first_entry - 1
    read = 0
    checked = mode in (_TEXT_CHECKED, _AUTO) and where.whole
    all_objects = checked and mode == _TEXT_CHECKED
    looks = LooksLikeCsv() if checked else None
    for number, raw in enumerate(_bounded(handle), start=where.first_line):
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
        if checked and entry == 1 and stripped[0] != "{" and is_csv_header(stripped):
            raise BatchInputError([], 0, message=header_message(name, number, stripped))
        if lines is not None and number not in lines:
            continue
        read += 1
        if len(raw) > MAX_LINE_CHARS:
            all_objects = False
            looks = None
            yield number, entry, Unreadable(f"longer than {MAX_LINE_CHARS} characters")
            continue
        if looks is not None:
            if stripped[0] == "{" and mode == _AUTO:
                looks = None  # records among the lines: written line by line, not a table
            else:
                looks.add(raw, number)
        if mode in (_TEXT, _TEXT_CHECKED):
            if all_objects:
                all_objects = stripped[0] == "{" and is_object(stripped)
            yield number, entry, raw
        elif mode == _AUTO:
            # A line that begins with { was meant as a record: broken, it is a bad line, not
            # a prompt billed as literal JSON. Any other line is a prompt as written.
            yield number, entry, load(stripped, AUTO_HINT) if stripped[0] == "{" else raw
        elif stripped[0] in '{["':
            yield number, entry, load(stripped)
        else:
            yield number, entry, Bare(stripped)
    if all_objects and read:
        raise BatchInputError(
            [],
            0,
            message=f"{name} is read as text, a prompt a line, but every line of it is a JSON "
            "object (JSON Lines): each would be billed as literal JSON text. Pass --format "
            "jsonl (format='jsonl') or name it .jsonl; --format text sends the lines as "
            "prompts; nothing was sent",
        )
    table = looks.column() if looks is not None else None
    if table is not None:
        raise BatchInputError([], 0, message=table_message(name, table))


def _bounded(handle: Any) -> Iterator[str]:
    """The lines of ``handle``, one longer than :data:`MAX_LINE_CHARS` cut there and the rest
    of it read and dropped a piece at a time: a file of one enormous line is never held whole
    (200 MB of it took 470 MB). A handle with no ``readline`` is read as it is iterated."""
    readline = getattr(handle, "readline", None)
    if readline is None:
        yield from handle
        return
    cut = False  # the last piece read ended in a CR that may be half of a CRLF
    while line := readline(MAX_LINE_CHARS + 2):  # a line at the limit, with its CRLF, whole
        if cut and line == "\n":
            cut = False
            continue
        cut = False
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            rest = line
            while not rest.endswith(("\n", "\r")) and (rest := readline(MAX_LINE_CHARS)):
                pass
            cut = rest.endswith("\r")
        yield line


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


# Tried in this order: a tab is never part of a prompt typed on one line, a comma often is.
_SEPARATORS = (("\t", "tab"), (",", "comma"))
# What a cell of a request field's column holds, read from the core's own lists (any case).
_FIELD_KINDS = (
    ("an aspect ratio", frozenset(ASPECT_RATIOS)),
    ("a resolution", frozenset(RESOLUTIONS)),
    ("a surface", frozenset(SURFACES)),
)


@dataclass(frozen=True)
class FieldColumn:
    """A column of a text input whose every cell is a request field: its separator's name,
    its 1-based number, and the cell the first line holds there (with that line's number)."""

    separator: str
    column: int
    line: int
    cell: str

    @property
    def kind(self) -> str:
        """What the first line's cell is: an aspect ratio, a resolution or a surface."""
        return field_kind(self.cell) or "a request field"


class LooksLikeCsv:
    """Whether lines read as text are the rows of a table without its header: split at tabs
    (or at commas), some column holds a request field (an aspect ratio, a resolution, a
    surface) on every line. Commas alone are no table: prompts hold them anywhere. Keeps the
    first line's cells, never the lines."""

    def __init__(self) -> None:
        self.lines = 0
        # Per separator: the columns (0-based) whose every cell so far is a request field.
        self._columns: dict[str, set[int]] = {}
        self._first: dict[str, list[str]] = {}
        self._first_line = 0

    def add(self, raw: str, number: int = 0) -> None:
        """Takes one line (its number, for the message that names the first one)."""
        for separator, _ in _SEPARATORS:
            if self.lines and not self._columns[separator]:
                continue  # ruled out already: a line without such a field ends it for good
            cells = _cells(raw, separator) if separator in raw else []
            fields = {i for i, cell in enumerate(cells) if field_kind(cell) is not None}
            if self.lines == 0:
                self._columns[separator], self._first[separator] = fields, cells
            else:
                self._columns[separator] &= fields
        if self.lines == 0:
            self._first_line = number
        self.lines += 1

    def column(self) -> FieldColumn | None:
        """The first column of request fields on every line, tabs before commas; None if
        there is none (or no line was added)."""
        for separator, word in _SEPARATORS:
            found = self._columns.get(separator) if self.lines else None
            if found:
                index = min(found)
                cell = self._first[separator][index].strip()
                return FieldColumn(word, index + 1, self._first_line, cell)
        return None


def field_kind(cell: str) -> str | None:
    """What request field ``cell`` (trimmed, any case) is, or None if it is none."""
    value = cell.strip().lower()
    for kind, values in _FIELD_KINDS:
        if value in values:
            return kind
    return None


def _cells(raw: str, separator: str) -> list[str]:
    """A line's cells as a CSV reader splits them (quotes keep separators in a cell)."""
    try:
        return next(csv.reader([raw], delimiter=separator), [])
    except csv.Error:  # a quote out of place: as a table with no quoting would read it
        return raw.split(separator)


def table_message(name: str, found: FieldColumn) -> str:
    """Why a text input that is a table without its header row is refused, and what to do."""
    return (
        f"{name} is read as text, a prompt a line, but column {found.column} of every line "
        f"(split at {found.separator}s) holds a request field, as a CSV table's rows do "
        f"(line {found.line}: {printable(found.cell, 20)!r}, {found.kind}): each line would "
        "be billed as literal text. To read it as CSV, add a first row naming its columns "
        f"({', '.join(CSV_COLUMNS)}) and pass --format csv (format='csv'); --format text "
        "sends every line as a prompt; nothing was sent"
    )


def is_csv_header(line: str) -> bool:
    """Whether a line read as text is a header row ``--format csv`` would read: column names
    (any case, maybe quoted) among ours, ``prompt`` one of them, none twice."""
    cells = [c.strip().strip('"').strip().lower() for c in line.split(_separator_of(line))]
    return "prompt" in cells and len(set(cells)) == len(cells) and set(cells) <= REQUEST_FIELDS


def _separator_of(header: str, *, tab: bool = False) -> str:
    """A header row's separator: a tab if it holds one, else a comma if it holds one; a header
    of one column holds neither, and the file's name says (``.tsv``: a tab)."""
    if "\t" in header:
        return "\t"
    if "," in header:
        return ","
    return "\t" if tab else ","


def header_message(name: str, number: int, line: str) -> str:
    """Why a text input whose first line is a header row of ours is refused, and what to do."""
    return (
        f"{name} is read as text, a prompt a line, but its line {number} "
        f"({printable(line, 60)!r}) is the header row of a CSV table: every line would be "
        "billed as literal text, that one too. Pass --format csv (format='csv') or name it "
        ".csv; --format text sends every line as a prompt; nothing was sent"
    )


def csv_items(handle: Any, where: Where, name: str, tab: bool) -> Iterator[tuple[int, int, Any]]:
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
            yield number, entry, Unreadable(record.error)
        elif len(record.cells) != len(header):
            yield number, entry, Unreadable(_field_count(record.cells, header))
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
            elif column_name not in REQUEST_FIELDS:
                shown = printable(record.cells[column - 1].strip(), 40)
                problem = f"the header row names an unknown column {shown!r} (column {column})"
            elif names.index(column_name) != column - 1:
                first = names.index(column_name) + 1
                problem = (
                    f"the header row names {column_name!r} twice (columns {first} and {column})"
                )
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
