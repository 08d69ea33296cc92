"""A static contact sheet of a batch: ``index.html`` in the output folder, opened from disk.

The page works from ``file://`` with no network: its styles and script are inline, and its cards
come from small script files beside it, loaded with ``<script>`` tags on demand (browsers refuse
``fetch`` of ``file://`` URLs). On disk::

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
import hashlib
import html
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from .._core import jsonio

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

        page = write_gallery("out/", iter_manifest("out/manifest.jsonl"), title="Spring set")
        print(page.as_uri())   # open it in a browser
    """
    folder = Path(folder)
    root = folder / GALLERY_DIR
    root.mkdir(exist_ok=True)
    generation = f"{time.time_ns():016x}-{secrets.token_hex(3)}"
    part = root / f".{generation}.part"
    part.mkdir()
    try:
        summary = _write_pages(part, records)
        os.replace(part, root / generation)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    summary.update(title=_text(title, TEXT_CHARS) or "", generation=generation,
                   written=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))  # fmt: skip
    page = folder / GALLERY_NAME
    tmp = folder / f".{GALLERY_NAME}.{generation}.part"
    try:
        tmp.write_text(_page_html(summary), encoding="utf-8")
        os.replace(tmp, page)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sweep(root, generation)
    return page


def iter_manifest(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of a ``manifest.jsonl``, one at a time (blank lines skipped).

    Example::

        write_gallery("out/", iter_manifest("out/manifest.jsonl"))
    """
    with Path(path).open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            record = jsonio.loads(text)
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {number} is not a JSON object")
            yield record


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
        with path.open("w", encoding="utf-8", errors="replace") as handle:
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
    if code == "result_expired":
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


def _csp_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def _page_html(summary: dict[str, Any]) -> str:
    # The policy lets only our own inline script and the page files beside the page run:
    # should anything ever slip data into the markup, it still cannot execute, and the page
    # cannot reach the network.
    policy = (
        "default-src 'none'; "
        f"script-src 'self' file: {_csp_hash(_SCRIPT)}; "
        f"style-src {_csp_hash(_STYLE)}; "
        "img-src 'self' file:; base-uri 'none'; form-action 'none'"
    )
    parts = {
        "POLICY": html.escape(policy),
        "TITLE": html.escape(summary["title"]),
        "STYLE": _STYLE,
        "SCRIPT": _SCRIPT,
        "DATA": _js_json(summary),
    }
    # One pass, so that a title spelling a placeholder stays text.
    return _PLACEHOLDER.sub(lambda match: parts[match[1]], _TEMPLATE)


_PLACEHOLDER = re.compile(r"@(POLICY|TITLE|STYLE|SCRIPT|DATA)@")
_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="@POLICY@">
<meta name="referrer" content="no-referrer">
<title>@TITLE@</title>
<style>@STYLE@</style>
<script id="gallery-data" type="application/json">@DATA@</script>
</head>
<body>
<header>
  <div class="heading">
    <h1 id="title"></h1>
    <p id="totals" class="totals"></p>
  </div>
  <nav id="filters" class="filters" aria-label="Filter by status"></nav>
  <div class="pager" id="pager-top"></div>
</header>
<main>
  <p id="notice" class="notice" role="status" hidden></p>
  <noscript><p class="notice">This page needs JavaScript to show its cards.</p></noscript>
  <div id="grid" class="grid" aria-live="polite"></div>
  <p id="empty" class="empty" hidden>No lines with this status.</p>
  <div class="pager bottom" id="pager-bottom"></div>
</main>
<script>@SCRIPT@</script>
</body>
</html>
"""

_STYLE = """
:root {
  --bg: #f4f5f7; --card: #fff; --text: #1c2330; --muted: #5a6375; --line: #dfe3ea;
  --ok: #116329; --ok-bg: #dcf3e2; --bad: #a3191a; --bad-bg: #fde4e3;
  --exp: #7a4500; --exp-bg: #fcefd2; --wait: #344463; --wait-bg: #e5e9f1;
  --accent: #2f5bd3;
}
* { box-sizing: border-box; }
html { background: var(--bg); }
body {
  margin: 0; color: var(--text); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
    sans-serif;
}
header {
  position: sticky; top: 0; z-index: 2; display: flex; flex-wrap: wrap; align-items: center;
  gap: 10px 28px; padding: 14px 28px; background: rgba(255, 255, 255, .97);
  border-bottom: 1px solid var(--line); box-shadow: 0 1px 3px rgba(16, 24, 40, .05);
}
.heading { min-width: 0; margin-right: auto; }
h1 { margin: 0; font-size: 19px; font-weight: 650; overflow-wrap: anywhere; }
.totals { margin: 2px 0 0; color: var(--muted); font-size: 13px; }
.totals b { color: var(--text); font-weight: 600; }
.filters { display: flex; flex-wrap: wrap; gap: 6px; }
.filters button, .pager button {
  font: inherit; color: var(--text); background: #fff; border: 1px solid var(--line);
  border-radius: 999px; padding: 5px 13px; cursor: pointer;
  display: inline-flex; align-items: center; gap: 7px;
}
.filters button:hover, .pager button:hover:not(:disabled) { border-color: #b8c0cc; }
.filters button[aria-pressed="true"] {
  background: var(--text); border-color: var(--text); color: #fff;
}
.filters .count { font-weight: 650; font-variant-numeric: tabular-nums; }
.dot { width: 9px; height: 9px; border-radius: 50%; background: var(--muted); flex: none; }
.dot.succeeded { background: #2da44e; } .dot.failed { background: #d1242f; }
.dot.expired { background: #d4a72c; } .dot.unfinished { background: #8c95a6; }
.filters [aria-pressed="true"] .dot { box-shadow: 0 0 0 2px #fff; }
.pager { display: flex; align-items: center; gap: 8px; color: var(--muted); }
.pager button:disabled { opacity: .45; cursor: default; }
.pager input {
  width: 4.5em; font: inherit; padding: 4px 6px; text-align: center;
  border: 1px solid var(--line); border-radius: 6px;
}
.pager.bottom { justify-content: center; padding: 4px 28px 32px; }
main { max-width: 1680px; margin: 0 auto; }
.notice {
  margin: 16px 28px 0; padding: 10px 14px; border-radius: 8px;
  background: var(--exp-bg); color: var(--exp);
}
.notice button { margin-left: 8px; font: inherit; cursor: pointer; }
.empty { margin: 48px; text-align: center; color: var(--muted); font-size: 15px; }
.grid {
  display: grid; gap: 18px; padding: 22px 28px;
  grid-template-columns: repeat(auto-fill, minmax(236px, 1fr));
}
.card {
  display: flex; flex-direction: column; min-width: 0; overflow: hidden;
  background: var(--card); border: 1px solid var(--line); border-radius: 12px;
  box-shadow: 0 1px 2px rgba(16, 24, 40, .05);
}
.card.succeeded { border-top: 3px solid #2da44e; } .card.failed { border-top: 3px solid #d1242f; }
.card.expired { border-top: 3px solid #d4a72c; } .card.unfinished { border-top: 3px solid #8c95a6; }
.frame {
  aspect-ratio: 4 / 3; display: flex; align-items: center; justify-content: center;
  background: #eceff3; border-bottom: 1px solid var(--line); overflow: hidden;
}
a.frame:focus-visible { outline: 3px solid var(--accent); outline-offset: -3px; }
.frame img { width: 100%; height: 100%; object-fit: contain; display: block; }
.frame.note {
  flex-direction: column; align-items: flex-start; justify-content: center; gap: 6px;
  padding: 16px 18px; overflow-wrap: anywhere;
}
.frame.note.failed { background: var(--bad-bg); color: var(--bad); }
.frame.note.expired { background: var(--exp-bg); color: var(--exp); }
.frame.note.unfinished, .frame.note.missing { background: var(--wait-bg); color: var(--wait); }
.note .code { font: 600 13px/1.3 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.note .message {
  margin: 0; font-size: 13px; display: -webkit-box; -webkit-line-clamp: 5;
  -webkit-box-orient: vertical; overflow: hidden;
}
.body { display: flex; flex-direction: column; gap: 8px; padding: 11px 13px 13px; }
.top { display: flex; align-items: center; justify-content: space-between; gap: 8px; }
.badge {
  display: inline-flex; align-items: center; gap: 5px; padding: 2px 9px; border-radius: 999px;
  font-size: 12px; font-weight: 650; white-space: nowrap;
}
.badge.succeeded { background: var(--ok-bg); color: var(--ok); }
.badge.failed { background: var(--bad-bg); color: var(--bad); }
.badge.expired { background: var(--exp-bg); color: var(--exp); }
.badge.unfinished { background: var(--wait-bg); color: var(--wait); }
.line { color: var(--muted); font-size: 12px; font-variant-numeric: tabular-nums; }
.prompt {
  margin: 0; font-size: 14px; overflow-wrap: anywhere; white-space: pre-wrap; cursor: pointer;
  display: -webkit-box; -webkit-line-clamp: 3; -webkit-box-orient: vertical; overflow: hidden;
}
.prompt.open { display: block; -webkit-line-clamp: none; }
.prompt.none { color: var(--muted); font-style: italic; cursor: default; }
.prompt.reason { color: var(--bad); cursor: default; }
.cut { color: var(--muted); font-size: 12px; }
[dir="auto"] { unicode-bidi: isolate; }
.prompt[dir="auto"], .message[dir="auto"] { unicode-bidi: plaintext; }
.invisible {
  display: inline-block; margin: 0 1px; padding: 0 3px; border: 1px solid #e3c46f;
  border-radius: 3px; background: #fff5d1; color: #6b4a00; font-style: normal;
  font: 600 11px/1.35 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  white-space: nowrap; unicode-bidi: isolate;
}
.meta {
  display: grid; grid-template-columns: auto 1fr; gap: 2px 10px; margin: 0;
  font-size: 12px; color: var(--muted);
}
.meta dt { color: var(--muted); }
.meta dd {
  margin: 0; color: var(--text); min-width: 0;
  overflow: hidden; text-overflow: ellipsis; white-space: nowrap;
}
.meta dd.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.files { display: flex; flex-wrap: wrap; gap: 4px 8px; font-size: 12px; }
.files a { color: var(--accent); }
@media (max-width: 700px) {
  header { padding: 10px 14px; position: static; }
  .grid { padding: 14px; gap: 12px; grid-template-columns: repeat(auto-fill, minmax(160px, 1fr)); }
}
"""

# Builds every element with textContent and setAttribute: data never becomes markup. A page
# file calls imggwPage(filter, page, rows); the rows are kept for a few pages only.
_SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("gallery-data").textContent);
  var FILTERS = ["all", "succeeded", "failed", "expired", "unfinished"];
  var LABELS = {all: "All", succeeded: "Succeeded", failed: "Failed", expired: "Expired",
                unfinished: "Unfinished"};
  var ICONS = {succeeded: "\u2713", failed: "\u2715", expired: "\u25F7", unfinished: "\u2026"};
  var KEEP = 12;
  // Shown as their codes, never as they are: controls (tab and line feed aside), the bidi
  // controls (an RLO in a prompt would make "evil" read "live", and reorder what follows) and
  // the invisible ones (zero-width, fillers, tags), which would hide text. The tags of a flag
  // (England's, Scotland's: the first group) draw the flag and are left alone.
  var HIDDEN = new RegExp(
    "(\\u{1F3F4}[\\u{E0020}-\\u{E007E}]+\\u{E007F})|" +
    "[\\0-\\x08\\x0B-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u115F\\u1160\\u17B4\\u17B5\\u180E" +
    "\\u200B\\u200E\\u200F\\u2028-\\u202E\\u2060-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB" +
    "\\u{1BCA0}-\\u{1BCA3}\\u{1D173}-\\u{1D17A}\\u{E0000}-\\u{E007F}]", "gu");
  var cache = new Map();
  var seq = 0;
  var current = {filter: "all", page: 1};
  var number = new Intl.NumberFormat("en-US", {maximumFractionDigits: 4});

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function fmt(value) { return typeof value === "number" ? number.format(value) : "\u2014"; }
  function codeOf(ch) {
    var hex = ch.codePointAt(0).toString(16);
    return hex.length > 4 ? "\\u{" + hex + "}" : "\\u" + ("000" + hex).slice(-4);
  }
  // Text for an attribute or the tab's title: hidden characters as their codes.
  function shown(text) {
    return String(text).replace(HIDDEN, function (found, flag) { return flag || codeOf(found); });
  }
  // Text from the data into an element of its own: isolated from what is around it, in its
  // own direction (dir=auto: from its first strong character), hidden characters as marked
  // codes that read left to right wherever they stand.
  function put(node, text) {
    var value = String(text), last = 0, found;
    node.setAttribute("dir", "auto");
    HIDDEN.lastIndex = 0;
    while ((found = HIDDEN.exec(value)) !== null) {
      if (found[1]) continue;
      if (found.index > last) {
        node.appendChild(document.createTextNode(value.slice(last, found.index)));
      }
      var mark = el("span", "invisible", codeOf(found[0]));
      mark.setAttribute("dir", "ltr");
      mark.setAttribute("title", "an invisible or control character, shown as its code");
      node.appendChild(mark);
      last = HIDDEN.lastIndex;
    }
    if (last < value.length) node.appendChild(document.createTextNode(value.slice(last)));
    return node;
  }
  // The one way a cut prompt is described, on the card and in its tooltip.
  function cutText(length) {
    return "first " + fmt(data.promptChars) + " of " + fmt(length) + " characters";
  }
  function safeSrc(src) {
    // The writer already refused anything else; checked again so a page file edited by hand
    // cannot link outside the folder or to a script URL.
    if (typeof src !== "string" || !src || src.charAt(0) === "/" || src.indexOf("\\") >= 0 ||
        /^[a-z][a-z0-9+.\-]*:/i.test(src)) return null;
    var parts = src.split("/");
    for (var i = 0; i < parts.length; i++) {
      if (parts[i] === "" || parts[i] === "..") return null;
    }
    return src;
  }

  window.imggwPage = function (filter, page, rows) {
    if (FILTERS.indexOf(filter) < 0 || !Array.isArray(rows)) return;
    cache.set(filter + "/" + page, rows);
    while (cache.size > KEEP) cache.delete(cache.keys().next().value);
  };

  function load(filter, page) {
    var key = filter + "/" + page;
    if (cache.has(key)) return Promise.resolve(cache.get(key));
    return new Promise(function (resolve, reject) {
      var script = document.createElement("script");
      script.src = "gallery/" + data.generation + "/" + filter + "/" + page + ".js";
      script.onload = function () {
        script.remove();
        if (cache.has(key)) resolve(cache.get(key)); else reject(new Error(key));
      };
      script.onerror = function () { script.remove(); reject(new Error(key)); };
      document.head.appendChild(script);
    });
  }

  function readHash() {
    var match = /^#([a-z]+)(?:\/([0-9]+))?$/.exec(location.hash);
    var filter = match && FILTERS.indexOf(match[1]) >= 0 ? match[1] : "all";
    var pages = Math.max(1, data.pages[filter] || 0);
    var page = match && match[2] ? parseInt(match[2], 10) : 1;
    return {filter: filter, page: Math.min(Math.max(page, 1), pages)};
  }
  function go(filter, page) {
    var hash = "#" + filter + "/" + page;
    if (location.hash === hash) render(); else location.hash = hash;
  }

  function header() {
    document.title = shown(data.title);
    put(document.getElementById("title"), data.title);
    var totals = document.getElementById("totals");
    [[fmt(data.counts.all), data.counts.all === 1 ? " line" : " lines"],
     [fmt(data.credits), " credits"], [fmt(data.cost), " cost"]].forEach(function (part) {
      totals.appendChild(el("b", "", part[0]));
      totals.appendChild(document.createTextNode(part[1] + " \u00B7 "));
    });
    totals.appendChild(document.createTextNode("written " + data.written));
    var nav = document.getElementById("filters");
    FILTERS.forEach(function (name) {
      var button = el("button");
      button.type = "button";
      button.setAttribute("data-filter", name);
      if (name !== "all") button.appendChild(el("span", "dot " + name));
      button.appendChild(el("span", "label", LABELS[name]));
      button.appendChild(el("span", "count", fmt(data.counts[name] || 0)));
      button.addEventListener("click", function () { go(name, 1); });
      nav.appendChild(button);
    });
  }

  function pager(box, state) {
    var pages = data.pages[state.filter] || 0;
    box.replaceChildren();
    if (pages <= 1) return;
    var prev = el("button", "prev", "\u2039 Prev");
    var next = el("button", "next", "Next \u203A");
    prev.type = next.type = "button";
    prev.disabled = state.page <= 1;
    next.disabled = state.page >= pages;
    prev.addEventListener("click", function () { go(state.filter, state.page - 1); });
    next.addEventListener("click", function () { go(state.filter, state.page + 1); });
    var input = el("input");
    input.type = "number"; input.min = "1"; input.max = String(pages);
    input.value = String(state.page);
    input.setAttribute("aria-label", "Page");
    input.addEventListener("change", function () {
      var page = parseInt(input.value, 10);
      if (page >= 1 && page <= pages) go(state.filter, page); else input.value = state.page;
    });
    var first = (state.page - 1) * data.pageSize + 1;
    var last = Math.min(state.page * data.pageSize, data.counts[state.filter] || 0);
    var where = el("span", "where");
    where.appendChild(document.createTextNode("Page "));
    where.appendChild(input);
    where.appendChild(document.createTextNode(" of " + fmt(pages)));
    var range = el("span", "range", "cards " + fmt(first) + "\u2013" + fmt(last));
    box.append(prev, where, next, range);
  }

  function meta(list, name, value, mono) {
    if (value === null || value === undefined || value === "") return;
    list.appendChild(el("dt", "", name));
    var dd = put(el("dd", mono ? "mono" : ""), value);
    dd.setAttribute("title", shown(value));
    list.appendChild(dd);
  }

  function note(kind, code, message) {
    var box = el("div", "frame note " + kind);
    box.appendChild(put(el("span", "code"), code));
    if (message) box.appendChild(put(el("p", "message"), message));
    return box;
  }

  function card(row) {
    var line = row[0], id = row[1], taskId = row[2], status = row[3], cat = row[4];
    var prompt = row[5], promptLength = row[6], aspect = row[7], resolution = row[8];
    var cost = row[9], credits = row[10], files = row[11] || [], width = row[12];
    var height = row[13], code = row[14], message = row[15], expires = row[16];
    var surface = row[17];
    var skipped = code === "invalid_line";  // a bad input line: never sent, nothing to show
    if (!LABELS[cat] || cat === "all") cat = "unfinished";
    var article = el("article", "card " + cat);
    article.setAttribute("data-status", cat);
    if (line !== null) article.setAttribute("data-line", String(line));
    var src = files.length ? safeSrc(files[0][0]) : null;
    if (skipped) {
      article.appendChild(note(cat, code, "Skipped: this input line was never sent."));
    } else if (cat === "failed" || cat === "expired") {
      article.appendChild(note(cat, code || "failed", message));
    } else if (src) {
      var link = el("a", "frame");
      link.setAttribute("href", src);
      link.setAttribute("target", "_blank");
      link.setAttribute("rel", "noopener noreferrer");
      link.setAttribute("title", "Open the full image");
      var img = el("img");
      img.setAttribute("loading", "lazy");
      img.setAttribute("decoding", "async");
      img.setAttribute("width", String(width));
      img.setAttribute("height", String(height));
      img.setAttribute("alt", prompt ? shown(prompt) : "line " + line);
      img.addEventListener("error", function () {
        link.replaceWith(note("missing", "file not found", files[0][0]));
      });
      img.setAttribute("src", src);
      link.appendChild(img);
      article.appendChild(link);
    } else if (cat === "succeeded") {
      article.appendChild(note("missing", "no viewable file", "Its path is outside this folder."));
    } else {
      var waiting = status === "succeeded" ? "Not downloaded yet." : "Not finished yet.";
      article.appendChild(note("unfinished", status, waiting));
    }

    var body = el("div", "body");
    var top = el("div", "top");
    var badge = el("span", "badge " + cat, ICONS[cat] + " ");
    if (cat === "unfinished") badge.appendChild(put(el("bdi"), status));
    else badge.appendChild(document.createTextNode(LABELS[cat]));
    top.appendChild(badge);
    top.appendChild(el("span", "line", line === null ? "line \u2014" : "line " + line));
    body.appendChild(top);
    var text;
    if (prompt) {
      text = put(el("p", "prompt"), prompt);
      text.setAttribute("title", "Click to show the " +
                        (promptLength ? cutText(promptLength) : "whole prompt"));
      text.addEventListener("click", function () { text.classList.toggle("open"); });
    } else if (skipped) {  // what was wrong with the line, in the prompt's place
      text = put(el("p", "prompt reason"), message || "no reason recorded");
    } else {
      text = el("p", "prompt none", "no prompt recorded");
    }
    body.appendChild(text);
    if (prompt && promptLength) {
      body.appendChild(el("span", "cut", cutText(promptLength) + "; the manifest has them all"));
    }
    var list = el("dl", "meta");
    meta(list, "ratio", [aspect, resolution].filter(Boolean).join(" \u00B7 "));
    meta(list, "credits", credits === null ? null : fmt(credits));
    meta(list, "cost", cost === null ? null : fmt(cost));
    meta(list, "id", id, true);
    meta(list, "task", taskId, true);
    if (taskId) meta(list, "surface", surface, true);  // where the task lives (it may be collected)
    if (!src || cat !== "succeeded") meta(list, "expires", expires);
    body.appendChild(list);
    if (files.length > 1) {
      var more = el("div", "files");
      files.forEach(function (file, i) {
        var href = safeSrc(file[0]);
        if (!href) return;
        var a = el("a", "", "image " + (i + 1));
        a.setAttribute("href", href);
        a.setAttribute("target", "_blank");
        a.setAttribute("rel", "noopener noreferrer");
        more.appendChild(a);
      });
      body.appendChild(more);
    }
    article.appendChild(body);
    return article;
  }

  function render() {
    var state = readHash();
    current = state;
    var mine = ++seq;
    document.querySelectorAll("#filters button").forEach(function (button) {
      button.setAttribute("aria-pressed",
                          String(button.getAttribute("data-filter") === state.filter));
    });
    pager(document.getElementById("pager-top"), state);
    pager(document.getElementById("pager-bottom"), state);
    var grid = document.getElementById("grid");
    var empty = document.getElementById("empty");
    if (!data.pages[state.filter]) {
      grid.replaceChildren();
      empty.hidden = false;
      document.body.setAttribute("data-shown", state.filter + "/" + state.page);
      return;
    }
    empty.hidden = true;
    load(state.filter, state.page).then(function (rows) {
      if (mine !== seq) return;
      grid.replaceChildren.apply(grid, rows.map(card));
      window.scrollTo(0, 0);
      document.body.setAttribute("data-shown", state.filter + "/" + state.page);
      if (state.page < data.pages[state.filter]) {
        load(state.filter, state.page + 1).catch(function () {});
      }
    }, function () {
      if (mine !== seq) return;
      var notice = document.getElementById("notice");
      notice.replaceChildren(document.createTextNode(
        "This gallery was rewritten since the page was opened."));
      var again = el("button", "", "Reload");
      again.type = "button";
      again.addEventListener("click", function () { location.reload(); });
      notice.appendChild(again);
      notice.hidden = false;
      document.body.setAttribute("data-shown", "stale");
    });
  }

  document.addEventListener("keydown", function (event) {
    if (event.target instanceof HTMLInputElement || event.altKey || event.ctrlKey ||
        event.metaKey) return;
    var pages = data.pages[current.filter] || 0;
    if (event.key === "ArrowLeft" && current.page > 1) go(current.filter, current.page - 1);
    if (event.key === "ArrowRight" && current.page < pages) go(current.filter, current.page + 1);
  });
  window.addEventListener("hashchange", render);
  header();
  render();
})();
"""
