"""Reading CSV input (RFC 4180, by Python's ``csv`` module): a header row naming the columns
(``prompt``, ``aspect_ratio``, ``resolution``, ``surface``, ``id``, in any order; comma- or
tab-separated, as the header is), then a record a row, numbered by the line it begins on. Also
what tells a file read as text that it is a CSV table (its first line a header row of our
columns, or a column whose every cell is a request field: an aspect ratio, a resolution, a
surface): such text is refused, not billed line by line as literal prompts. Commas alone say
nothing: "a cat, watercolor" is a prompt.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .._core.rules import ASPECT_RATIOS, RESOLUTIONS, SURFACES
from .._core.text import printable
from ._lines import (
    CSV_COLUMNS,
    ENTRY,
    HEADER,
    MORE,
    REQUEST_FIELDS,
    SKIPPED,
    BadLine,
    BatchInputError,
    Unreadable,
    Where,
)

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
