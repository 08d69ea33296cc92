"""``manifest.jsonl``: one row per input line, in line order, written whole or not at all; the
one writer and reader of it, for a run, a shard and a merge.

A row has DESIGN 7's pinned fields (``line``, ``task_id``, ``status``, ``files``, ``error``),
then the caller's ``id``, the surface, the request, money and link expiry, and for a saved
line that has one a ``warning`` (``code``, ``message``: its files kept their default names).
``status`` is the line's word of ``_states.STATUS``, from its state's ``line_state``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._core import jsonio
from .._files import atomic_write
from ._schema import SAVED, STATUS, Row, line_state, storage_error

__all__ = ["MANIFEST_NAME", "iter_manifest", "manifest_row", "manifest_rows", "write_manifest"]

MANIFEST_NAME = "manifest.jsonl"


def manifest_row(row: Row) -> dict[str, Any]:
    """One manifest row of a ledger row. ``files`` lists the files of a saved line only (a
    line waiting to download them again may remember files that are gone).

    Example::

        write_manifest("out/", (manifest_row(row) for row in ledger.iter_rows()))
    """
    error = None
    if row.error_code is not None:
        error = {"code": row.error_code, "message": row.error_message or ""}
    note = None
    if row.state is SAVED and error is not None:  # a saved line's is a note (a name not used)
        note, error = error, None
    expires = None
    if row.expires_at is not None:
        moment = datetime.fromtimestamp(row.expires_at, tz=timezone.utc)
        expires = moment.isoformat().replace("+00:00", "Z")
    return {
        "line": row.line,
        "task_id": row.task_id,
        "status": STATUS[line_state(row.state)],
        "files": row.files if row.state is SAVED else [],
        "error": error,
        "id": row.caller_id,
        "surface": row.surface,
        "prompt": row.fields.get("prompt"),
        "aspect_ratio": row.fields.get("aspect_ratio"),
        "resolution": row.fields.get("resolution"),
        "cost": row.cost,
        "credits": row.credits,
        "expires_at": expires,
    } | ({"warning": note} if note is not None else {})


# Its first name, kept for code that imported it.
manifest_record = manifest_row


def manifest_rows(rows: Iterable[Row]) -> Iterator[dict[str, Any]]:
    """The manifest rows of ledger rows, as they come (line order in, line order out)."""
    return (manifest_row(row) for row in rows)


def write_manifest(folder: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> Path:
    """Writes ``folder/manifest.jsonl`` from rows in line order, whole or not at all (a temp
    file, then a rename); returns its path. Rows are written as they come: memory stays
    bounded.

    Example::

        write_manifest("out/", iter_manifest("elsewhere/manifest.jsonl"))
    """
    path = Path(folder) / MANIFEST_NAME
    try:
        with atomic_write(path) as handle:
            for row in rows:
                handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
    except OSError as exc:
        raise storage_error(path, exc) from exc
    return path


def iter_manifest(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The rows of a ``manifest.jsonl``, one at a time (blank lines skipped); a line that is
    not a JSON object raises ``ValueError`` naming it.

    Example::

        write_gallery("out/", iter_manifest("out/manifest.jsonl"))
    """
    with Path(path).open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            row = jsonio.loads(text)
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {number} is not a JSON object")
            yield row
