"""How a run is cut into shards: contiguous ranges of input lines, named and numbered the same
way by every process that cuts the same file, and their slices of the input.

Shard ``I`` of ``N`` holds lines ``(I-1)*T//N + 1`` to ``I*T//N`` of a file of ``T`` lines
(blank and comment lines counted), so every process that cuts the same file into ``N`` agrees
without talking. An output folder keeps each shard's files under ``shards/<name>/``.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
from collections import deque
from pathlib import Path

from ..._core.exceptions import RequestValidationError
from ..._files import TEMP_BYTES, create_new
from .._input import CSV_SUFFIXES, JSON_SUFFIX, JSONL_SUFFIXES, line_kinds
from .._lines import ENTRY, HEADER, MORE
from ._storage import Storage

__all__ = [
    "SHARDS_DIR",
    "check_shard",
    "parse_shard",
    "scratch_folder",
    "shard_folder",
    "shard_name",
    "shard_range",
    "slice_name",
    "write_slices",
]

SHARDS_DIR = "shards"
SLICE_NAME = "input"
SHARD_NAME = re.compile(r"(\d{4,})-of-(\d{4,})")
_SHARD_TEXT = "must be I/N with 1 <= I <= N (shard I of N)"


def shard_name(index: int, count: int) -> str:
    """The shard's folder name under ``shards/``: ``0002-of-0004``."""
    return f"{index:04d}-of-{count:04d}"


def shard_folder(index: int, count: int) -> str:
    """The shard's folder, relative to the output folder: ``shards/0002-of-0004``."""
    return f"{SHARDS_DIR}/{shard_name(index, count)}"


def shard_range(index: int, count: int, total: int) -> range:
    """The line numbers of shard ``index`` (1-based) of ``count`` in a file of ``total`` lines.

    Example::

        assert shard_range(2, 3, 10) == range(4, 7)   # lines 4, 5 and 6
    """
    check_shard(index, count)
    return range((index - 1) * total // count + 1, index * total // count + 1)


def check_shard(index: object, count: object) -> tuple[int, int]:
    """``(index, count)`` when they name a shard, else one clear error."""
    ok = isinstance(index, int) and isinstance(count, int) and not isinstance(index, bool)
    if not ok or not 1 <= index <= count:  # type: ignore[operator]
        raise RequestValidationError("shard", _SHARD_TEXT, code="invalid_shard")
    return index, count  # type: ignore[return-value]


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: shard 2 of 4.

    Example::

        index, count = parse_shard("2/4")
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None:
        raise RequestValidationError("shard", _SHARD_TEXT, code="invalid_shard")
    return check_shard(int(match[1]), int(match[2]))


def scratch_folder(dest: str, scratch: str | os.PathLike[str] | None) -> Path:
    """Where a remote folder's shards work on this machine (one folder per output folder)."""
    base = Path(scratch) if scratch is not None else Path(tempfile.gettempdir()) / "imggw-scratch"
    return base / hashlib.sha256(dest.rstrip("/").encode()).hexdigest()[:16]


def slice_name(source: str) -> str:
    """The name of a shard's slice of ``source`` (its kind kept: JSONL, CSV, text, or
    ``.json``, read line by line as its source is)."""
    suffix = Path(source).suffix.lower()
    kept = (*JSONL_SUFFIXES, JSON_SUFFIX, *CSV_SUFFIXES)
    return SLICE_NAME + (suffix if suffix in kept else ".txt")


def write_slices(
    source: str,
    storage: Storage,
    count: int,
    total: int,
    work: Path,
    *,
    format: str | None = None,
) -> list[int]:
    """Cuts ``source`` into the slices of ``count`` shards, each put in its shard's folder in
    the output folder (where every worker can read it); returns each slice's first entry
    number (see ``InputLine``). Blocking.

    A CSV record belongs to the shard its first line is in: its slice begins with the header
    row, then holds the shard's lines, a record that goes on past them whole, and a blank line
    in place of the header row and of the rest of a record begun in an earlier slice, so that
    each line keeps its place (the slice's lines are numbered from the one before the shard's
    first: see ``_shards``)."""
    name = slice_name(source)
    first_entries = []
    entries = 0
    kinds = line_kinds(source, format=format)
    header = next((raw for raw, kind in line_kinds(source, format=format) if kind == HEADER), None)
    ahead: deque[tuple[str, str]] = deque()  # lines read past a slice, to place in the next
    for index in range(1, count + 1):
        first_entries.append(entries + 1)
        part = work / f".{name}.{index}.{secrets.token_hex(TEMP_BYTES)}"
        with os.fdopen(create_new(part), "w", encoding="utf-8", newline="") as out:
            if header is not None:
                out.write(header)
            mine = False  # the record going on began in this slice
            for _ in shard_range(index, count, total):
                raw, kind = ahead.popleft() if ahead else next(kinds)
                entries += kind == ENTRY
                if kind != MORE:
                    mine = kind == ENTRY
                out.write("\n" if kind == HEADER or (kind == MORE and not mine) else raw)
            while mine and header is not None:  # the last record, to its end
                following = next(kinds, None)
                if following is None:
                    break
                ahead.append(following)
                mine = following[1] == MORE
                if mine:
                    out.write(following[0])
        try:
            storage.put(part, f"{shard_folder(index, count)}/{name}")
        finally:
            part.unlink(missing_ok=True)
    kinds.close()
    return first_entries
