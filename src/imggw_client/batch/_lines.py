"""What reading a batch's input yields, whatever its format: an :class:`InputLine` (a request
to generate, or a task to collect) or a :class:`BadLine`, and :class:`BatchInputError` when
the input is refused. Shared by the readers (``_input`` for JSONL, text and standard input,
``_csv`` for CSV, ``_parse`` for what a record says) and by the plan that takes their lines.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from .._core.exceptions import ImggwError
from .._core.models import ImageRequest

CSV_COLUMNS = ("prompt", "aspect_ratio", "resolution", "surface", "id")
REQUEST_FIELDS = frozenset(CSV_COLUMNS)  # what a request line may carry
SHOWN_BAD_LINES = 10  # bad lines an error names; more go to a file in the output folder
BAD_LINES_NAME = "bad-lines.txt"
GENERATE, COLLECT = "generate", "collect"
# What each line of a file is, to those who cut it into slices and count its entries
# (``_input.line_kinds``): an entry begins on it, it goes on one begun earlier (CSV), it is the
# header row (CSV), or it is skipped (blank, a comment).
HEADER, ENTRY, MORE, SKIPPED = "header", "entry", "more", "skipped"


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
            what: list[str] = [
                GENERATE,
                r.prompt,
                r.aspect_ratio,
                r.resolution.lower(),
                self.surface or surface,
            ]
        else:
            what = [COLLECT, self.task_id or "", self.surface or surface]
        return hashlib.sha256(json.dumps(what, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line of the input that cannot be run, and why (its 1-based number).

    Example::

        BadLine(3, "prompt is required")
    """

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


@dataclass
class Tally:
    """What a pass over an input skipped and counted besides its lines: ``comments``."""

    comments: int = 0


@dataclass(frozen=True)
class Where:
    """The part of a source read and how it is numbered (see ``_input.iter_lines``), the tally
    the pass counts into, and whether it is a whole input (see ``_input.parse_lines``)."""

    lines: range | None
    first_line: int
    first_entry: int
    tally: Tally
    whole: bool


class Unreadable:
    """A line (or CSV record) that holds no value to parse, and why: a bad line."""

    def __init__(self, why: str) -> None:
        self.why = why


def is_comment(stripped: str) -> bool:
    """Whether a line (its surrounding whitespace stripped) is a comment: ``#`` followed by
    whitespace or by nothing. ``#hashtag sunset`` and ``#1 bestseller`` are prompts.
    """
    return stripped[:1] == "#" and (len(stripped) == 1 or stripped[1].isspace())
