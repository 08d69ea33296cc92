"""Reading a written gallery back: the summary inline in index.html and the page files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from imggw_client.batch._gallery import GALLERY_DIR, GALLERY_NAME

_DATA = re.compile(r'<script id="gallery-data" type="application/json">(.*?)</script>', re.S)
_CALL = re.compile(r'imggwPage\("([a-z]+)",([0-9]+),(.*)\);\n', re.S)


def summary(folder: Path) -> dict[str, Any]:
    """The summary the page reads (counts, pages, totals, generation)."""
    match = _DATA.search((folder / GALLERY_NAME).read_text(encoding="utf-8"))
    assert match is not None
    data: dict[str, Any] = json.loads(match[1])
    return data


def page_file(folder: Path, name: str, page: int) -> Path:
    generation: str = summary(folder)["generation"]
    return folder / GALLERY_DIR / generation / name / f"{page}.js"


def page_rows(path: Path) -> list[list[Any]]:
    """The card rows of one page file, checking that it is the one call the page expects."""
    match = _CALL.fullmatch(path.read_text(encoding="utf-8"))
    assert match is not None, path
    rows: list[list[Any]] = json.loads(match[3])
    return rows


def rows(folder: Path, name: str = "all") -> list[list[Any]]:
    """Every card row of a filter, page after page."""
    found: list[list[Any]] = []
    for page in range(1, summary(folder)["pages"][name] + 1):
        found += page_rows(page_file(folder, name, page))
    return found


def record(line: int, **fields: Any) -> dict[str, Any]:
    """A manifest record of a downloaded line, with the given fields changed."""
    base: dict[str, Any] = {
        "line": line,
        "id": f"id-{line}",
        "task_id": str(1000 + line),
        "status": "succeeded",
        "files": [{"path": f"{1000 + line}-0.png", "sha256": "0" * 64, "size": 10}],
        "error": None,
        "prompt": f"prompt {line}",
        "aspect_ratio": "16:9",
        "resolution": "2k",
        "cost": 0.04,
        "credits": 4,
        "expires_at": None,
    }
    return {**base, **fields}
