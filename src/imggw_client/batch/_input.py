"""Reading a batch's input: JSONL (``prompt``, ``aspect_ratio``, ``resolution``, optional
``id``) or plain text (one prompt a line). Blank lines and lines starting with ``#`` are
skipped; every other line becomes a request or a reported bad line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import ImggwError, RequestValidationError
from .._models import ImageRequest

JSONL_SUFFIXES = (".jsonl", ".ndjson")
_FIELDS = {"prompt", "aspect_ratio", "resolution", "id"}


@dataclass(frozen=True, slots=True)
class InputLine:
    """One logical request: its 1-based line number, the caller's id if any, the request."""

    line: int
    request: ImageRequest
    caller_id: str | None = None

    @property
    def identity(self) -> str:
        """What ties this line to its ledger row across runs: the caller's id, else the line."""
        return f"id:{self.caller_id}" if self.caller_id is not None else f"line:{self.line}"


@dataclass(frozen=True, slots=True)
class BadLine:
    line: int
    reason: str


class BatchInputError(ImggwError):
    """The input has bad lines and the batch was told to stop on them; nothing was sent.

    Example::

        except BatchInputError as err:
            for bad in err.bad_lines:
                print(f"line {bad.line}: {bad.reason}")
    """

    def __init__(self, bad_lines: list[BadLine]) -> None:
        first = bad_lines[0]
        more = f" (and {len(bad_lines) - 1} more)" if len(bad_lines) > 1 else ""
        super().__init__(
            f"line {first.line}: {first.reason}{more}; nothing was sent", code="invalid_input"
        )
        self.bad_lines = bad_lines


def read_lines(source: str | Path | Iterable[Any]) -> tuple[list[InputLine], list[BadLine]]:
    """The requests and the bad lines of a file path, or of an iterable of ``ImageRequest``,
    dicts (the JSONL fields) or prompt strings (position = line number)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RequestValidationError("source", f"cannot read {path}: {exc}") from exc
        jsonl = path.suffix.lower() in JSONL_SUFFIXES
        items: list[tuple[int, Any]] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            stripped = raw.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if not jsonl:
                items.append((number, raw))
                continue
            try:
                items.append((number, json.loads(stripped)))
            except ValueError:
                items.append((number, _Unreadable()))
    else:
        items = list(enumerate(source, start=1))
    return _parse(items)


class _Unreadable:
    pass


def _parse(items: list[tuple[int, Any]]) -> tuple[list[InputLine], list[BadLine]]:
    lines: list[InputLine] = []
    bad: list[BadLine] = []
    seen_ids: dict[str, int] = {}
    for number, item in items:
        try:
            parsed = _one(number, item)
        except _Bad as problem:
            bad.append(BadLine(number, str(problem)))
            continue
        if parsed.caller_id is not None:
            if parsed.caller_id in seen_ids:
                bad.append(
                    BadLine(
                        number, f"id {parsed.caller_id!r} repeats line {seen_ids[parsed.caller_id]}"
                    )
                )
                continue
            seen_ids[parsed.caller_id] = number
        lines.append(parsed)
    return lines, bad


class _Bad(Exception):
    pass


def _one(number: int, item: Any) -> InputLine:
    if isinstance(item, ImageRequest):
        return InputLine(number, item)
    if isinstance(item, str):
        item = {"prompt": item}
    if isinstance(item, _Unreadable) or not isinstance(item, dict):
        raise _Bad("not a JSON object")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        raise _Bad(f"unknown field {unknown[0][:40]!r}")
    if "prompt" not in item:
        raise _Bad("prompt is required")
    caller_id = item.get("id")
    if caller_id is not None and (
        isinstance(caller_id, bool) or not isinstance(caller_id, (str, int))
    ):
        raise _Bad("id must be a string or an integer")
    try:
        request = ImageRequest(
            item["prompt"], item.get("aspect_ratio", "auto"), item.get("resolution", "1k")
        )
    except RequestValidationError as err:
        raise _Bad(err.message) from None
    return InputLine(number, request, None if caller_id is None else str(caller_id))
