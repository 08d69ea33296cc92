"""A static contact sheet of a batch: ``index.html`` in the output folder, opened from disk.

The page works from ``file://`` with no network: its styles and script are inline, and its cards
come from small script files beside it, loaded with ``<script>`` tags on demand (browsers refuse
``fetch`` of ``file://`` URLs). Its markup, style and script are the package's data files in
``gallery_assets/``; this module fills in the data. On disk::

    index.html                                 the page, with the counts and totals inline
    gallery/<generation>/<filter>/<page>.js    one page of cards, one set of pages per filter

Every filter (all, succeeded, failed, expired, unfinished) has its own pages, so any page of any
filter is one small file however long the batch: a million lines cost two million card rows
on disk (each line is in ``all`` and in its own status) and the browser only ever holds a few
pages. Records are read in one pass with bounded memory, each generation is written into a
temporary folder and renamed into place before ``index.html`` is replaced, so a reader never sees
half a gallery.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple, TextIO
from urllib.parse import quote

from .._core import reasons
from .._files import atomic_write, create_new, refuse_link

GALLERY_NAME = "index.html"
GALLERY_DIR = "gallery"
PAGE_SIZE = 200
FILTERS = ("all", "succeeded", "failed", "expired", "unfinished")
# A card shows a few lines of text: longer values are cut so that a page file stays small even
# for 20,000-character prompts (the manifest keeps them whole). Characters are code points, as
# the gateway counts a prompt's length: the page says "first 2,000 of 20,000" whatever they are.
PROMPT_CHARS = 2_000
TEXT_CHARS = 300
FILES_PER_CARD = 16
THUMB_LONG_SIDE = 320
# Temporary generations this old belong to no live writer (a writer takes seconds, not hours).
STALE_PART_NS = 3600 * 10**9

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_GENERATION = re.compile(r"[0-9a-f]{16}-[0-9a-f]{6}")
# Inline and page-file JSON never contains these raw: `</script>`, `<!--` and HTML entities
# cannot break out of a script element, and U+2028/U+2029 are not line ends in older engines.
_JS_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def write_gallery(
    folder: str | os.PathLike[str],
    records: Iterable[dict[str, Any]],
    *,
    title: str = "imggw batch",
) -> Path:
    """Writes ``index.html`` (and its page files under ``gallery/``) into ``folder``, an
    existing batch output folder, from manifest records in line order; returns its path.

    ``records`` is read once, as it comes: memory stays bounded however many there are. Missing
    or malformed fields show as blank; file paths that are absolute, contain ``..`` or a URL
    scheme are never linked. Rewriting replaces the previous gallery whole.

    Example::

        from imggw_client.batch import iter_manifest, write_gallery

        run_batch("prompts.jsonl", "out/")
        page = write_gallery("out/", iter_manifest("out/manifest.jsonl"), title="Spring set")
        print(page.resolve().as_uri())   # open it in a browser
    """
    folder = Path(folder)
    root = folder / GALLERY_DIR
    refuse_link(root)  # the pages go into no folder a planted link names
    root.mkdir(exist_ok=True)
    refuse_link(root)
    generation = f"{time.time_ns():016x}-{secrets.token_hex(3)}"
    part = root / f".{generation}.part"
    part.mkdir()
    try:
        summary = _write_pages(part, records)
        os.replace(part, root / generation)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    summary.update(
        title=_text(title, TEXT_CHARS) or "",
        generation=generation,
        written=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )
    page = folder / GALLERY_NAME
    with atomic_write(page) as handle:
        handle.write(_page_html(summary).encode("utf-8"))
    _sweep(root, generation)
    return page


# ---------------------------------------------------------------------------- pages on disk


class _Pages:
    """The page files of one filter, written as soon as each is full."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder / name
        self.folder.mkdir()
        self.name = name
        self.rows: list[str] = []
        self.count = 0
        self.pages = 0

    def add(self, row: str) -> None:
        self.rows.append(row)
        self.count += 1
        if len(self.rows) == PAGE_SIZE:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        self.pages += 1
        path = self.folder / f"{self.pages}.js"
        # A new file in a folder made for this gallery: never one planted there first.
        with os.fdopen(create_new(path), "w", encoding="utf-8", errors="replace") as handle:
            _write_call(handle, self.name, self.pages, self.rows)
        self.rows = []


def _write_call(handle: TextIO, name: str, page: int, rows: list[str]) -> None:
    # errors="replace" on the handle: a lone surrogate in a prompt becomes "?", never a failure.
    handle.write(f'imggwPage("{name}",{page},[\n')
    handle.write(",\n".join(rows))
    handle.write("]);\n")


def _write_pages(part: Path, records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    pages = {name: _Pages(part, name) for name in FILTERS}
    credits = cost = 0.0
    for record in records:
        record = record if isinstance(record, dict) else {}
        category, row = _card(record)
        text = _js_json(row)
        pages["all"].add(text)
        pages[category].add(text)
        credits += _number(record.get("credits")) or 0
        cost += _number(record.get("cost")) or 0
    for each in pages.values():
        each.flush()
    return {
        "pageSize": PAGE_SIZE,
        "promptChars": PROMPT_CHARS,
        "counts": {name: each.count for name, each in pages.items()},
        "pages": {name: each.pages for name, each in pages.items()},
        # Sums of huge values can overflow: shown as unknown rather than failing the page.
        "credits": _number(round(credits, 6)),
        "cost": _number(round(cost, 6)),
    }


def _sweep(root: Path, current: str) -> None:
    """Removes older generations but the newest of them (a reader who opened the page just
    before this rewrite can still turn its pages), and temporary ones left by a crash. A newer
    generation belongs to a concurrent writer and is left alone."""
    older: list[str] = []
    now = time.time_ns()
    for entry in root.iterdir():
        name = entry.name
        if _GENERATION.fullmatch(name) and name < current:
            older.append(name)
        elif name.startswith(".") and name.endswith(".part"):
            stamp = name[1:17]
            if re.fullmatch(r"[0-9a-f]{16}", stamp) and now - int(stamp, 16) > STALE_PART_NS:
                shutil.rmtree(entry, ignore_errors=True)
    for name in sorted(older)[:-1]:
        shutil.rmtree(root / name, ignore_errors=True)


# ---------------------------------------------------------------------------- one card


def _card(record: dict[str, Any]) -> tuple[str, list[Any]]:
    """The filter a record belongs to and its card row (the order ``card()`` in the page's
    script reads): line, id, task id, status, category, prompt, prompt length when cut (in code
    points), aspect ratio, resolution, cost, credits, files ``[[src or null, size], ...]``,
    thumbnail width and height, error code, error message, expires_at, surface."""
    status = _text(record.get("status"), TEXT_CHARS) or "pending"
    error = record.get("error")
    code = message = None
    if isinstance(error, dict):
        code = _text(error.get("code"), TEXT_CHARS) or "error"
        message = _text(error.get("message"), TEXT_CHARS)
    raw_files = record.get("files")
    files = raw_files if isinstance(raw_files, list) else []
    shown = [
        [_src(f.get("path")), _number(f.get("size"))] if isinstance(f, dict) else [None, None]
        for f in files[:FILES_PER_CARD]
    ]
    if code == reasons.RESULT_EXPIRED.code:
        category = "expired"
    elif status == "failed" or code is not None:
        category = "failed"
    elif status == "succeeded" and shown:
        category = "succeeded"
    else:
        category = "unfinished"  # pending, running, or succeeded but not downloaded yet
    prompt = record.get("prompt")
    full = len(prompt) if isinstance(prompt, str) and len(prompt) > PROMPT_CHARS else None
    aspect = _text(record.get("aspect_ratio"), TEXT_CHARS)
    width, height = _thumb_size(aspect)
    line = record.get("line")
    return category, [
        line if isinstance(line, int) and not isinstance(line, bool) else None,
        _text(record.get("id"), TEXT_CHARS),
        _text(record.get("task_id"), TEXT_CHARS),
        status,
        category,
        _text(prompt, PROMPT_CHARS),
        full,
        aspect,
        _text(record.get("resolution"), TEXT_CHARS),
        _number(record.get("cost")),
        _number(record.get("credits")),
        shown,
        width,
        height,
        code,
        message,
        _text(record.get("expires_at"), TEXT_CHARS),
        _text(record.get("surface"), TEXT_CHARS),
    ]


def _text(value: object, limit: int) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = value if isinstance(value, str) else str(value)
    return text[:limit]


def _number(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _src(path: object) -> str | None:
    """A link to the file, relative to the page: only plain relative paths inside the folder.
    Percent-encoding keeps ``#``, ``?`` and ``:`` in a name from being read as URL syntax."""
    if not isinstance(path, str) or not path or len(path) > 1024:
        return None
    if path.startswith("/") or "\\" in path or _SCHEME.match(path):
        return None
    parts = path.split("/")
    if any(part in ("", "..") for part in parts) or _CONTROL.search(path):
        return None
    return quote(path, safe="/")


def _thumb_size(aspect: str | None) -> tuple[int, int]:
    """Width and height attributes that give the thumbnail its shape before it loads."""
    try:
        w, h = (int(part) for part in (aspect or "").split(":"))
    except ValueError:
        return THUMB_LONG_SIDE, THUMB_LONG_SIDE  # "auto" and anything unreadable: square
    if not (0 < w <= 100 and 0 < h <= 100):
        return THUMB_LONG_SIDE, THUMB_LONG_SIDE
    if w >= h:
        return THUMB_LONG_SIDE, max(1, round(THUMB_LONG_SIDE * h / w))
    return max(1, round(THUMB_LONG_SIDE * w / h)), THUMB_LONG_SIDE


def _js_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element and as a script file."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_JS_ESCAPES)


# ---------------------------------------------------------------------------- the page

# The page's markup, style and script are files of this package, read once and inlined as they
# are: each style and script file is exactly the text of its element, which is what the policy's
# hashes cover. The script builds every element with textContent and setAttribute (data never
# becomes markup); a page file calls imggwPage(filter, page, rows), as _write_call writes it.
ASSETS_DIR = "gallery_assets"
TEMPLATE_FILE, STYLE_FILE, SCRIPT_FILE = "page.html", "gallery.css", "gallery.js"
_PLACEHOLDER = re.compile(r"@(POLICY|TITLE|STYLE|SCRIPT|DATA)@")


class _Assets(NamedTuple):
    template: str
    style: str
    script: str
    policy: str


@functools.cache
def _assets() -> _Assets:
    # By package resource rather than by path beside this file: it also works when the package
    # is imported from a zip.
    folder = resources.files(__name__.rpartition(".")[0]) / ASSETS_DIR
    template, style, script = (
        (folder / name).read_text(encoding="utf-8")
        for name in (TEMPLATE_FILE, STYLE_FILE, SCRIPT_FILE)
    )
    # The policy lets only our own inline script and the page files beside the page run:
    # should anything ever slip data into the markup, it still cannot execute, and the page
    # cannot reach the network.
    policy = (
        "default-src 'none'; "
        f"script-src 'self' file: {_csp_hash(script)}; "
        f"style-src {_csp_hash(style)}; "
        "img-src 'self' file:; base-uri 'none'; form-action 'none'"
    )
    return _Assets(template, style, script, policy)


def _csp_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def _page_html(summary: dict[str, Any]) -> str:
    assets = _assets()
    parts = {
        "POLICY": html.escape(assets.policy),
        "TITLE": html.escape(summary["title"]),
        "STYLE": assets.style,
        "SCRIPT": assets.script,
        "DATA": _js_json(summary),
    }
    # One pass, so that a title spelling a placeholder stays text.
    return _PLACEHOLDER.sub(lambda match: parts[match[1]], assets.template)
