"""What one record of a batch's input says: a JSON value, a dict, a prompt or an
``ImageRequest`` read into an :class:`InputLine` (a request to generate, or with ``task_id`` a
task made elsewhere to collect), or the reason it is a bad line (:class:`Bad`). The readers
(``_input``, ``_csv``) find the records; this module alone knows their fields.
"""

from __future__ import annotations

import json
from typing import Any

from .._core import jsonio, rules
from .._core.config import SURFACES
from .._core.exceptions import RequestValidationError
from .._core.models import ImageRequest
from .._core.text import printable
from ._lines import REQUEST_FIELDS, InputLine, Unreadable

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
        return isinstance(jsonio.loads(text), dict)
    except ValueError:
        return False


AUTO_HINT = " (a line that begins with { is read as one; --format text reads it as a prompt)"


def load(text: str, hint: str = "") -> Any:
    """A line's JSON value, or why it has none."""
    try:
        return jsonio.loads(text, unique_keys=True)
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
