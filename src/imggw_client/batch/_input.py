"""Reading a batch's input, one line at a time (a file of a million lines never sits in memory).

A line is either a request to generate (``prompt``, optional ``aspect_ratio``, ``resolution``,
``id``) or, with ``task_id`` (and an optional ``surface``), a task made elsewhere to collect: it
is never submitted, only waited on and downloaded, and its other fields are kept for the
manifest. Files ending in ``.jsonl``/``.ndjson`` hold one JSON object a line; ``.json`` files and
standard input are read line by line, a JSON object a record and any other line a prompt; any
other file holds one prompt a line, and one whose every line is a JSON object is refused (it is
JSONL under another name: each line would be billed as literal JSON text). ``format="jsonl"``
or ``"text"`` says it outright. Blank lines and lines starting with ``#`` are skipped.
``collect=True`` reads a list of tasks instead: bare task ids or JSON objects with ``task_id``,
so what ``imggw --json submit`` prints, and a batch's ``manifest.jsonl``, pipe straight in (its
rows of lines that never had a task are left out: there is nothing to collect).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections.abc import Iterable, Iterator
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
FORMATS = ("jsonl", "text")
# How lines are read: one JSON value a line; a prompt a line; a prompt a line, refused whole
# if every line is a JSON object; a JSON object a line where one begins, else a prompt.
_JSONL, _TEXT, _TEXT_CHECKED, _AUTO = "jsonl", "text", "text-checked", "auto"
SHOWN_BAD_LINES = 10  # bad lines an error names; more go to a file in the output folder
BAD_LINES_NAME = "bad-lines.txt"
GENERATE, COLLECT = "generate", "collect"
_REQUEST_FIELDS = {"prompt", "aspect_ratio", "resolution", "id"}
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
    """One line of work: its 1-based line number, the caller's id if any, and either the
    request to generate or the task to collect (``task_id``, with its ``surface`` if the line
    names one). ``fields`` keeps the request's text for the manifest and the gallery.
    ``entry`` counts the input's lines that are neither blank nor comments (bad ones
    included): a line with no id is known by it, so a comment or blank line added anywhere
    changes no line's identity (nor its key)."""

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
            what: list[str] = [GENERATE, r.prompt, r.aspect_ratio, r.resolution.lower(), surface]
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

    ``format`` is ``"jsonl"`` (a JSON object a line), ``"text"`` (a prompt a line) or None:
    told by the file's name (``.jsonl``, ``.ndjson``: JSONL), else line by line for ``.json``
    files and standard input (a line that begins with ``{`` is a JSON object, any other line
    a prompt as written, ``"Hello," said the fox`` and ``[cinematic] a fox`` included), else
    text; a text file whose every line is a JSON object raises :class:`BatchInputError` once
    read through (it is JSONL under another name). ``collect`` lists are read as they always
    were, whatever the format.

    ``lines`` keeps only the lines whose numbers it holds (a shard's range: the others are
    skipped unparsed); ``first_line`` and ``first_entry`` are the numbers of the source's
    first line and entry (a shard's slice of a larger input keeps its lines' numbers).

    Example::

        for item in iter_lines("prompts.json", format="jsonl"):
            print(item)
    """
    if format is not None and format not in FORMATS:
        raise RequestValidationError("format", "must be 'jsonl' or 'text' (or None: by the name)")
    items = _raw_items(source, collect, format, lines, first_line, first_entry)
    for number, entry, item in items:
        try:
            parsed = _parse_collect(number, item) if collect else _parse(number, item)
        except _Bad as problem:
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
    if suffix is None or suffix == JSON_SUFFIX:
        return _AUTO
    return _JSONL if suffix in JSONL_SUFFIXES else _TEXT_CHECKED


def _raw_items(
    source: Any,
    collect: bool,
    format: str | None = None,
    lines: range | None = None,
    first_line: int = 1,
    first_entry: int = 1,
) -> Iterator[tuple[int, int, Any]]:
    if isinstance(source, (str, Path)) and str(source) == "-":
        yield from _stdin_items(_mode(collect, format, None), lines, first_line, first_entry)
        return
    if isinstance(source, io.TextIOBase) or hasattr(source, "readline"):
        mode = _mode(collect, format, None)
        yield from _text_items(source, mode, lines, first_line, first_entry, "the input")
        return
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            # utf-8-sig: a byte-order mark some editors write is not part of the first line.
            handle = path.open(encoding="utf-8-sig", newline="")
        except OSError as exc:
            raise RequestValidationError("source", f"cannot read {path}: {exc.strerror}") from exc
        with handle:
            mode = _mode(collect, format, path.suffix.lower())
            try:
                yield from _text_items(handle, mode, lines, first_line, first_entry, str(path))
            except UnicodeDecodeError as exc:
                raise RequestValidationError(
                    "source", f"cannot read {path}: not UTF-8 text ({exc.reason})"
                ) from exc
        return
    for offset, item in enumerate(source):
        number = first_line + offset
        if lines is None or number in lines:
            yield number, first_entry + offset, item


def _stdin_items(
    mode: str, lines: range | None, first_line: int, first_entry: int
) -> Iterator[tuple[int, int, Any]]:
    """Standard input, read as bytes and decoded as a file is (UTF-8, a byte-order mark
    dropped, lines cut alike) whatever the terminal's encoding, so that input that is not
    UTF-8 is one clear error."""
    where = "standard input"
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream in its place (embedding): already decoded
        yield from _text_items(sys.stdin, mode, lines, first_line, first_entry, where)
        return
    handle = io.TextIOWrapper(buffer, encoding="utf-8-sig", newline="")
    try:
        yield from _text_items(handle, mode, lines, first_line, first_entry, where)
    except UnicodeDecodeError as exc:
        raise RequestValidationError(
            "source", f"cannot read standard input: not UTF-8 text ({exc.reason})"
        ) from exc
    finally:
        handle.detach()  # sys.stdin's own buffer stays open


def _text_items(
    handle: Any,
    mode: str,
    lines: range | None,
    first_line: int,
    first_entry: int,
    where: str,
) -> Iterator[tuple[int, int, Any]]:
    # Every mode decides a line by that line alone, so input streams through in bounded
    # memory; only the check of a text file (is every line a JSON object?) waits for its end,
    # and it keeps one flag, not the lines: nothing is sent before the whole input is read.
    entry = first_entry - 1
    read = 0
    all_objects = mode == _TEXT_CHECKED
    for number, raw in enumerate(handle, start=first_line):
        if lines is not None and number >= lines.stop:
            break  # a range is contiguous: nothing of it comes later
        raw = raw.rstrip("\r\n")
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        entry += 1  # counted before the range too: entries are numbered over the whole input
        if lines is not None and number not in lines:
            continue
        read += 1
        if len(raw) > MAX_LINE_CHARS:
            all_objects = False
            yield number, entry, _Unreadable(f"longer than {MAX_LINE_CHARS} characters")
        elif mode in (_TEXT, _TEXT_CHECKED):
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
            message=f"{where} is read as text, a prompt a line, but every line of it is a JSON "
            "object (JSON Lines): each would be billed as literal JSON text. Pass --format "
            "jsonl (format='jsonl') or name it .jsonl; --format text sends the lines as "
            "prompts; nothing was sent",
        )


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
        raise _Bad("not a JSON object")
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
    try:
        request = ImageRequest(
            item["prompt"], item.get("aspect_ratio", "auto"), item.get("resolution", "1k")
        )
    except RequestValidationError as err:
        raise _Bad(err.message) from None
    return InputLine(number, request, caller_id, fields=_fields(request))


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
    surface = item.get("surface")
    if surface is not None and surface not in SURFACES:
        raise _Bad(f"surface must be one of {', '.join(SURFACES)}")
    kept = {k: item[k] for k in _KEPT if isinstance(item.get(k), str)}
    return InputLine(number, None, _caller_id(item.get("id")), task_id, surface, kept)


def _fields(request: ImageRequest) -> dict[str, str]:
    return {"prompt": request.prompt, "aspect_ratio": request.aspect_ratio,
            "resolution": request.resolution}  # fmt: skip
