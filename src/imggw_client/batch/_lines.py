"""A line of a batch's input, whatever its format: what one record says (a JSON value, a dict,
a prompt or an ``ImageRequest``) read into an :class:`InputLine` (a request to generate, or with
``task_id`` a task made elsewhere to collect), or a :class:`BadLine` and why, and
:class:`BatchInputError` when the input is refused. The readers (``_input``) find the records;
this module alone knows their fields.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core import rules
from .._core.config import SURFACES
from .._core.exceptions import ImggwError, RequestValidationError
from .._core.models import ImageRequest
from .._core.text import json_loads, printable

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
            return request_digest(r.prompt, r.aspect_ratio, r.resolution, self.surface or surface)
        return _digest([COLLECT, self.task_id or "", self.surface or surface])


def request_digest(prompt: str, aspect_ratio: str, resolution: str, surface: str) -> str:
    """The digest of a line that asks for an image (see :meth:`InputLine.digest`)."""
    return _digest([GENERATE, prompt, aspect_ratio, resolution.lower(), surface])


def _digest(what: list[str]) -> str:
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

        Path("bad.jsonl").write_text('{"prompt": "a fox"}\\n{"aspect_ratio": "1:1"}\\n')
        try:
            run_batch("bad.jsonl", "out/")
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


# What a collect line may carry besides task_id: what submit/status/poll print, a manifest's
# fields, and the request it came from (kept for the manifest and the gallery).
_COLLECT_FIELDS = {
    "task_id",
    "surface",
    "id",
    "prompt",
    "aspect_ratio",
    "resolution",
    "idempotency_key",
    "line",
    "status",
    "progress",
    "image_urls",
    "error",
    "files",
    "cost",
    "credits",
    "expires_at",
}
_KEPT = ("prompt", "aspect_ratio", "resolution")


def is_object(text: str) -> bool:
    try:
        return isinstance(json_loads(text), dict)
    except ValueError:
        return False


AUTO_HINT = " (a line that begins with { is read as one; --format text reads it as a prompt)"


def load(text: str, hint: str = "") -> Any:
    """A line's JSON value, or why it has none."""
    try:
        return json_loads(text, unique_keys=True)
    except ValueError:
        repeated = _repeated_key(text)
        if repeated is not None:
            return Unreadable(f"repeated key {printable(repeated, 40)!r}")
        return Unreadable("not a JSON object" + hint)


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


class Bare(str):
    """A line that is not JSON: a prompt in a batch of prompts, a task id in a collect list."""


class Bad(Exception):
    """Why a record is a bad line (its message is the reason the report gives)."""


def _caller_id(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Bad("id must be a string or an integer")
    text = str(value)
    if not text or len(text) > 255 or not text.isprintable():
        raise Bad("id must be 1 to 255 printable characters")
    return text


def parse(number: int, item: Any) -> InputLine | None:
    """The line a record of a batch of requests makes (one with ``task_id`` collects that
    task), or :class:`Bad`.
    """
    if isinstance(item, ImageRequest):
        return InputLine(number, item, fields=_fields(item))
    if isinstance(item, Unreadable):
        raise Bad(item.why)
    if isinstance(item, Bare):  # a JSONL batch: a line that is not JSON is a mistake
        raise Bad("not a JSON object" + (_COMMENT_HINT if item.startswith("#") else ""))
    if isinstance(item, str):
        item = {"prompt": item}
    if not isinstance(item, dict):
        raise Bad("not a JSON object")
    if "task_id" in item:
        return parse_collect(number, item)
    unknown = sorted(set(item) - REQUEST_FIELDS)
    if unknown:
        raise Bad(f"unknown field {printable(unknown[0], 40)!r}")
    if "prompt" not in item:
        raise Bad("prompt is required (or task_id, to collect a task made elsewhere)")
    caller_id = _caller_id(item.get("id"))
    surface = _surface(item.get("surface"))
    try:
        request = ImageRequest(
            item["prompt"], item.get("aspect_ratio", "auto"), item.get("resolution", "1k")
        )
    except RequestValidationError as err:
        raise Bad(err.message) from None
    return InputLine(number, request, caller_id, surface=surface, fields=_fields(request))


_COMMENT_HINT = " (a comment line begins with '# ': a # and a space)"


def _surface(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in SURFACES:
        raise Bad(f"surface must be one of {', '.join(SURFACES)}")
    return value


def parse_collect(number: int, item: Any) -> InputLine | None:
    """The line a record of a collect list makes: a bare task id or an object with
    ``task_id``; None for a manifest's row of a line that never had a task; or :class:`Bad`.
    """
    if isinstance(item, Unreadable):
        raise Bad(item.why)
    if isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool)):
        item = {"task_id": str(item)}  # a bare id, or a JSON string or number
    if not isinstance(item, dict):
        raise Bad("not a task id, nor a JSON object with task_id")
    unknown = sorted(set(item) - _COLLECT_FIELDS)
    if unknown:
        raise Bad(f"unknown field {printable(unknown[0], 40)!r}")
    task_id = item.get("task_id")
    if task_id is None and "status" in item:
        return None  # a manifest's row of a line that never had a task: nothing to collect
    if task_id is None:
        raise Bad("task_id is null: this record names no task (never submitted)")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    broken = rules.check_task_id(task_id)
    if broken:
        shown = printable(task_id, 40) if isinstance(task_id, str) else type(task_id).__name__
        raise Bad(f"task_id {shown!r} is not a task id: it {broken[0].rule}")
    surface = _surface(item.get("surface"))
    kept = {k: item[k] for k in _KEPT if isinstance(item.get(k), str)}
    return InputLine(number, None, _caller_id(item.get("id")), task_id, surface, kept)


def _fields(request: ImageRequest) -> dict[str, str]:
    return {
        "prompt": request.prompt,
        "aspect_ratio": request.aspect_ratio,
        "resolution": request.resolution,
    }
