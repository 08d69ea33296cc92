"""write_gallery on disk: escaping, refused paths, counts and totals, bounded pages at 10,000
lines, old manifests, atomic rewrites."""

from __future__ import annotations

import html
import json
import math
import os
import re
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imggw_client.batch import _gallery, iter_manifest
from imggw_client.batch._gallery import (
    GALLERY_DIR,
    GALLERY_NAME,
    PAGE_SIZE,
    PROMPT_CHARS,
    write_gallery,
)

from .helpers import page_file, page_rows, record, rows, summary

# Card row columns (see _card in the module).
LINE, ID, TASK, STATUS, CATEGORY, PROMPT, FULL_LENGTH, ASPECT, RESOLUTION = range(9)
COST, CREDITS, FILES, WIDTH, HEIGHT, CODE, MESSAGE, EXPIRES, SURFACE = range(9, 18)

HOSTILE = [
    "<script>alert(1)</script>",
    "</script><script>alert(2)</script>",
    "<!--<script>",
    "\"'><img src=x onerror=alert(3)>",
    "&lt;b&gt; &amp; \u2028\u2029 line\nbreak",
    "javascript:alert(4)",
    "@TITLE@ @SCRIPT@ @DATA@",
]
RAW_IN_DATA = ("<", ">", "&", "\u2028", "\u2029")


def hostile_record(line: int, text: str) -> dict[str, Any]:
    return record(
        line,
        id=text,
        task_id=text,
        prompt=text,
        aspect_ratio=text,
        resolution=text,
        expires_at=text,
        status="failed",
        files=[{"path": text}],
        surface=text,
        error={"code": text, "message": text},
    )


def test_hostile_text_in_every_field_stays_data(tmp_path: Path) -> None:
    records = [hostile_record(i, text) for i, text in enumerate(HOSTILE, 1)]
    page = write_gallery(tmp_path, records, title=HOSTILE[1])
    markup = page.read_text(encoding="utf-8")
    # Our two script elements and nothing else: the data never opens or closes one.
    assert len(re.findall(r"<script", markup)) == 2
    assert len(re.findall(r"</script", markup)) == 2
    assert "<title>&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;</title>" in markup
    assert summary(tmp_path)["title"] == HOSTILE[1]
    for name in ("all", "failed"):
        text = page_file(tmp_path, name, 1).read_text(encoding="utf-8")
        body = text[text.index("[") :]
        assert not any(raw in body for raw in RAW_IN_DATA)
    for row, text in zip(rows(tmp_path), HOSTILE, strict=True):
        for column in (ID, TASK, PROMPT, ASPECT, RESOLUTION, EXPIRES, CODE, MESSAGE, SURFACE):
            assert row[column] == text  # escaped on disk, the same text when read
        ((src, _size),) = row[FILES]
        # Never a scheme nor a control character; any other name is a percent-encoded link.
        refused = text.startswith("javascript:") or "\n" in text
        assert src is None if refused else re.fullmatch(r"[\w.~%/-]+", src)


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "../secret.png",
        "a/../../b.png",
        "a/./../b.png",
        "javascript:alert(1)",
        "JavaScript:alert(1)",
        "data:image/png;base64,AAAA",
        "http://example.invalid/x.png",
        "//example.invalid/x.png",
        "C:\\x.png",
        "c:/x.png",
        "a\\..\\b.png",
        "a//b.png",
        "",
        "x\n.png",
        "..",
        7,
        None,
    ],
)
def test_paths_outside_the_folder_are_never_linked(tmp_path: Path, path: object) -> None:
    write_gallery(tmp_path, [record(1, files=[{"path": path, "sha256": "0", "size": 1}])])
    ((row),) = rows(tmp_path)
    assert row[FILES] == [[None, 1]]
    assert row[CATEGORY] == "succeeded"  # the task did succeed; its card shows no image


@pytest.mark.parametrize(
    ("path", "src"),
    [("1-0.png", "1-0.png"), ("sub/a b#1?.png", "sub/a%20b%231%3F.png"), ("é.png", "%C3%A9.png")],
)
def test_names_are_percent_encoded_relative_links(tmp_path: Path, path: str, src: str) -> None:
    write_gallery(tmp_path, [record(1, files=[{"path": path, "sha256": "0", "size": 5}])])
    assert rows(tmp_path)[0][FILES] == [[src, 5]]


def test_counts_totals_and_the_filter_of_each_line(tmp_path: Path) -> None:
    records = [
        record(1),
        record(2, status="failed", files=[], error={"code": "content_policy", "message": "no"}),
        record(3, files=[], error={"code": "result_expired", "message": "gone"}),
        record(4, status="running", files=[], credits=None, cost=None),
        record(5, status="pending", task_id=None, files=[], credits=None, cost=None),
        record(6, status="succeeded", files=[]),  # billed, not downloaded yet
        {
            "line": 7,
            "id": None,
            "task_id": None,
            "status": "failed",
            "files": [],
            "error": {"code": "invalid_line", "message": "line 7: not JSON"},
        },
        record(8, cost=0.1, credits=2.5),
    ]
    write_gallery(tmp_path, records)
    data = summary(tmp_path)
    assert data["counts"] == {"all": 8, "succeeded": 2, "failed": 2, "expired": 1, "unfinished": 3}
    assert data["pages"] == {"all": 1, "succeeded": 1, "failed": 1, "expired": 1, "unfinished": 1}
    assert data["credits"] == 4 * 4 + 2.5
    assert data["cost"] == pytest.approx(4 * 0.04 + 0.1)
    assert [row[LINE] for row in rows(tmp_path)] == list(range(1, 9))
    assert [row[LINE] for row in rows(tmp_path, "failed")] == [2, 7]
    assert [row[LINE] for row in rows(tmp_path, "unfinished")] == [4, 5, 6]
    ((expired),) = rows(tmp_path, "expired")
    assert (expired[STATUS], expired[CODE], expired[MESSAGE]) == (
        "succeeded",
        "result_expired",
        "gone",
    )
    assert rows(tmp_path, "failed")[1][CODE] == "invalid_line"


def test_totals_that_overflow_show_as_unknown_and_the_page_is_still_written(
    tmp_path: Path,
) -> None:
    write_gallery(tmp_path, [record(1, cost=1e308, credits=2), record(2, cost=1e308, credits=2)])
    data = summary(tmp_path)
    assert (data["cost"], data["credits"]) == (None, 4)
    assert [row[COST] for row in rows(tmp_path)] == [1e308, 1e308]


def test_empty_batch(tmp_path: Path) -> None:
    write_gallery(tmp_path, [])
    data = summary(tmp_path)
    assert set(data["counts"].values()) == {0}
    assert set(data["pages"].values()) == {0}


def test_old_manifest_records_and_garbage_fields(tmp_path: Path) -> None:
    pinned_only = {
        "line": 3,
        "task_id": "9",
        "status": "succeeded",
        "error": None,
        "files": [{"path": "9-0.png", "sha256": "0" * 64, "size": 10}],
    }
    odd = {
        "line": True,
        "status": ["x"],
        "files": "nope",
        "error": "boom",
        "cost": math.nan,
        "credits": "4",
        "aspect_ratio": "0:9",
        "prompt": {"a": 1},
    }
    write_gallery(tmp_path, [pinned_only, {}, odd, "not a dict"])  # type: ignore[list-item]
    first, empty, garbage, not_a_dict = rows(tmp_path)
    assert first == [
        3,
        None,
        "9",
        "succeeded",
        "succeeded",
        None,
        None,
        None,
        None,
        None,
        None,
        [["9-0.png", 10]],
        320,
        320,
        None,
        None,
        None,
        None,
    ]
    assert empty[STATUS] == "pending"
    assert empty[CATEGORY] == "unfinished"
    assert garbage[LINE] is None
    assert (garbage[COST], garbage[CREDITS], garbage[PROMPT], garbage[FILES]) == (
        None,
        None,
        None,
        [],
    )
    assert (garbage[WIDTH], garbage[HEIGHT]) == (320, 320)
    assert not_a_dict[CATEGORY] == "unfinished"


def test_thumbnail_shape_and_long_prompts(tmp_path: Path) -> None:
    long = "x" * 20_000
    write_gallery(
        tmp_path, [record(1, aspect_ratio="9:16", prompt=long), record(2, aspect_ratio="3:2")]
    )
    tall, wide = rows(tmp_path)
    assert (tall[WIDTH], tall[HEIGHT]) == (180, 320)
    assert (wide[WIDTH], wide[HEIGHT]) == (320, 213)
    assert tall[PROMPT] == long[:PROMPT_CHARS]
    assert tall[FULL_LENGTH] == 20_000
    assert wide[FULL_LENGTH] is None


def test_prompts_are_cut_and_counted_in_code_points(tmp_path: Path) -> None:
    # Beyond the BMP a character is two UTF-16 units: the page must not count those.
    foxes = "\U0001f98a" * 20_000
    write_gallery(tmp_path, [record(1, prompt=foxes), record(2, prompt="x" * 18_704)])
    emoji, plain = rows(tmp_path)
    assert (emoji[PROMPT], emoji[FULL_LENGTH]) == (foxes[:PROMPT_CHARS], 20_000)
    assert (plain[PROMPT], plain[FULL_LENGTH]) == ("x" * PROMPT_CHARS, 18_704)
    assert summary(tmp_path)["promptChars"] == PROMPT_CHARS  # the count the page shows


def test_each_card_row_carries_the_surface_of_its_task(tmp_path: Path) -> None:
    write_gallery(tmp_path, [record(1, surface="beta"), record(2, surface="alpha"), record(3)])
    assert [row[SURFACE] for row in rows(tmp_path)] == ["beta", "alpha", None]


def ten_thousand() -> Iterator[dict[str, Any]]:
    for line in range(1, 10_001):
        if line % 50 == 0:
            yield record(
                line,
                status="failed",
                files=[],
                error={"code": "content_policy", "message": "refused " * 20},
            )
        else:
            yield record(line, prompt=f"prompt {line}: " + "a long scene description, " * 8)


@pytest.mark.slow
def test_ten_thousand_lines_make_small_pages_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cards: list[int] = []

    def card(record: dict[str, Any]) -> Any:
        cards.append(record.get("line", 0))
        return real_card(record)

    real_card = _gallery._card
    monkeypatch.setattr(_gallery, "_card", card)
    tracemalloc.start()
    try:
        write_gallery(tmp_path, ten_thousand())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Linear by count, not by the clock: each line made into a card once, in one pass (a
    # writer that went back over the lines it had would take minutes at this size).
    assert cards == list(range(1, 10_001))
    # The page files hold about 6 MB: what is kept at once is a page per filter.
    assert peak < 2_000_000
    data = summary(tmp_path)
    assert data["counts"]["all"] == 10_000
    assert data["pages"] == {"all": 50, "succeeded": 49, "failed": 1, "expired": 0, "unfinished": 0}
    assert (tmp_path / GALLERY_NAME).stat().st_size < 64_000
    generation = tmp_path / GALLERY_DIR / data["generation"]
    sizes = [path.stat().st_size for path in generation.rglob("*.js")]
    assert len(sizes) == 100
    assert max(sizes) < 150_000
    lines = [row[LINE] for row in rows(tmp_path)]
    assert lines == list(range(1, 10_001))
    assert all(len(page_rows(page_file(tmp_path, "all", n))) == PAGE_SIZE for n in range(1, 51))
    assert [row[LINE] for row in rows(tmp_path, "failed")] == list(range(50, 10_001, 50))


def generations(folder: Path) -> list[str]:
    return sorted(path.name for path in (folder / GALLERY_DIR).iterdir())


def test_a_rewrite_replaces_the_gallery_and_keeps_one_older_generation(tmp_path: Path) -> None:
    write_gallery(tmp_path, [record(1), record(2)])
    first = summary(tmp_path)["generation"]
    write_gallery(tmp_path, [record(1)])
    second = summary(tmp_path)["generation"]
    assert generations(tmp_path) == [first, second]  # a reader of the first can still page
    write_gallery(tmp_path, [record(1, prompt="third")])
    third = summary(tmp_path)["generation"]
    assert generations(tmp_path) == [second, third]
    assert rows(tmp_path)[0][PROMPT] == "third"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_a_failed_rewrite_leaves_the_previous_gallery_whole(tmp_path: Path) -> None:
    write_gallery(tmp_path, [record(1)])
    before = (tmp_path / GALLERY_NAME).read_bytes()
    kept = generations(tmp_path)

    def broken() -> Iterator[dict[str, Any]]:
        yield from (record(n) for n in range(1, 500))
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write_gallery(tmp_path, broken())
    assert (tmp_path / GALLERY_NAME).read_bytes() == before
    assert generations(tmp_path) == kept  # its half-written pages are gone
    assert rows(tmp_path)[0][LINE] == 1


def test_the_page_is_replaced_by_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renamed: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: Any, dst: Any) -> None:
        renamed.append((Path(src).name, Path(dst).name))
        assert Path(src).exists()
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_gallery(tmp_path, [record(1)])
    generation = summary(tmp_path)["generation"]
    # The pages are in place before the page that names them, which is written under a name
    # no one can guess (to plant a link there first).
    assert renamed[0] == (f".{generation}.part", generation)
    assert renamed[1][1] == GALLERY_NAME
    assert re.fullmatch(rf"\.{re.escape(GALLERY_NAME)}\.[0-9a-f]{{32}}\.part", renamed[1][0])
    assert len(renamed) == 2


def test_crash_leftovers_are_swept_but_a_live_writer_is_not(tmp_path: Path) -> None:
    root = tmp_path / GALLERY_DIR
    old = root / f".{time.time_ns() - 2 * 3600 * 10**9:016x}-abcdef.part"
    live = root / f".{time.time_ns():016x}-abcdef.part"
    for folder in (old, live):
        (folder / "all").mkdir(parents=True)
    write_gallery(tmp_path, [record(1)])
    assert not old.exists()
    assert live.exists()


def test_the_page_names_nothing_outside_itself(tmp_path: Path) -> None:
    markup = write_gallery(tmp_path, [record(1)]).read_text(encoding="utf-8")
    assert not re.search(r"https?:|//[a-z]|@import|url\(|fetch\(|XMLHttpRequest", markup)
    assert "default-src 'none'" in html.unescape(markup)


def test_iter_manifest_streams_records(tmp_path: Path) -> None:
    path = tmp_path / "manifest.jsonl"
    path.write_text(json.dumps(record(1)) + "\n\n" + json.dumps(record(2)) + "\n")
    assert [r["line"] for r in iter_manifest(path)] == [1, 2]
    path.write_text(json.dumps(record(1)) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match="line 2 is not a JSON object"):
        list(iter_manifest(path))
