"""The gallery in a real browser: Debian's headless Chromium opens index.html from disk.

A real batch against the reference gateway (one line fails, one prompt is hostile, one input
line is bad, one task is collected from the other surface) and a 10,000-line gallery: images
decode, data shows as text and never runs, bidirectional and invisible characters can neither
reorder nor hide text, the header counts are right, filters and pages change the cards, and a
screenshot has content.
Chromium missing is a failure, not a skip: `.ci/run` installs it.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from imggw_client import PollPolicy
from imggw_client.batch import iter_manifest, run_batch
from imggw_client.batch._gallery import PAGE_SIZE, write_gallery
from imggw_client.mock import MockGateway
from imggw_client.mock._png import png

from .helpers import record

CHROMIUM = os.environ.get("IMGGW_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FAST_POLL = PollPolicy(initial_interval=0.02, max_interval=0.1)
VIEWPORT = {"width": 1366, "height": 900}
ON_SCREEN = (
    "i => { const r = i.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight; }"
)

HOSTILE = "<script>alert(1)</script>"
HOSTILE_2 = '</script><img src=x onerror="window.pwned=2"> \u2028 & \'single\' "double"'
HOSTILE_ID = '"><img src=x onerror="window.pwned=3">'
INPUT = [
    json.dumps({"prompt": "a red fox in fresh snow at dawn", "aspect_ratio": "16:9", "id": "fox"}),
    json.dumps({"prompt": HOSTILE, "aspect_ratio": "1:1", "id": HOSTILE_ID}),
    json.dumps({"prompt": "a lighthouse on a cliff #fail", "aspect_ratio": "3:2"}),
    "not json at all",
    json.dumps({"prompt": HOSTILE_2, "aspect_ratio": "9:16"}),
    json.dumps(
        {"prompt": "a quiet harbour, watercolour", "aspect_ratio": "4:3", "resolution": "2k"}
    ),
]
COLLECTED = "a lighthouse made elsewhere, collected here"  # line 7, a task of surface alpha
RLO = "\u202e"
# What the page must never show as it is (see HIDDEN in the page's script).
RAW_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f\ufeff]"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: install it with `apt-get install -y chromium` "
            "(.ci/run does), or point IMGGW_CHROMIUM at a Chromium binary",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        # launch() gives every run a fresh, temporary user-data-dir.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=30_000)
        yield browser
        browser.close()


@dataclass
class Opened:
    """A page of the gallery, with what the browser reported while it was open."""

    page: Page
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def shown(self, state: str) -> None:
        self.page.wait_for_selector(f'body[data-shown="{state}"]', timeout=10_000)

    def wait_for(self, expression: str, timeout: float = 10.0) -> None:
        """Polls from here: the page's Content-Security-Policy refuses the eval that
        Playwright's wait_for_function uses, and it stays on in these tests."""
        deadline = time.monotonic() + timeout
        while not self.page.evaluate(expression):
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            self.page.wait_for_timeout(50)

    def images_loaded(self) -> None:
        """Waits for the images on screen (lazy ones further down are not fetched yet)."""
        self.wait_for(f"Array.from(document.images).filter({ON_SCREEN}).every(i => i.complete)")

    def cards(self) -> list[dict[str, str]]:
        result: list[dict[str, str]] = self.page.eval_on_selector_all(
            ".card", "cards => cards.map(c => ({line: c.dataset.line, status: c.dataset.status}))"
        )
        return result


def open_gallery(browser: Browser, folder: Path, hash: str = "") -> Opened:
    page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    opened = Opened(page)

    def dialog(d: Any) -> None:
        opened.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    page.on("pageerror", lambda err: opened.errors.append(str(err)))
    page.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)
    page.on("request", lambda r: opened.requests.append(r.url))
    page.goto((folder / "index.html").as_uri() + hash)
    return opened


# ---------------------------------------------------------------------------- a real batch


@dataclass
class Batch:
    folder: Path
    credits: float


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Batch:
    folder = tmp_path_factory.mktemp("gallery")
    source = folder / "in.jsonl"
    # A gateway of its own: one batch for the module, and the family's gateways are per test.
    gateway = MockGateway(duration_min=0.02, duration_max=0.05, image_size=128)
    with gateway.client() as alpha:  # a task made elsewhere, on the other surface
        made = alpha.submit(COLLECTED, surface="alpha")
    collected = {"task_id": made.task_id, "surface": "alpha", "prompt": COLLECTED}
    source.write_text("\n".join([*INPUT, json.dumps(collected)]) + "\n")
    out = folder / "out"
    # In a thread of its own: Playwright's sync API keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        report = pool.submit(
            run_batch,
            source,
            out,
            skip_bad_lines=True,
            client_factory=lambda: gateway.async_client(poll=FAST_POLL),
        ).result()
    assert report.counts == {"saved": 5, "failed": 1}
    assert (out / "index.html").is_file()  # the batch writes its gallery itself ...
    # ... and `imggw gallery` rewrites it from the manifest, here under a title of our own.
    write_gallery(out, iter_manifest(out / "manifest.jsonl"), title="Spring set")
    return Batch(out, report.credits)


@pytest.fixture
def batch_folder(batch: Batch) -> Path:
    return batch.folder


@pytest.mark.slow
def test_every_visible_image_decodes(browser: Browser, batch_folder: Path) -> None:
    opened = open_gallery(browser, batch_folder)
    opened.shown("all/1")
    opened.images_loaded()
    images = opened.page.eval_on_selector_all(
        ".grid img",
        f"""imgs => imgs.map(i => ({{w: i.naturalWidth, visible: ({ON_SCREEN})(i),
                                    href: i.closest("a").getAttribute("href")}}))""",
    )
    assert len(images) == 5  # one per succeeded line
    visible = [image for image in images if image["visible"]]
    assert visible
    assert all(image["w"] > 0 for image in visible)
    assert all((batch_folder / image["href"]).is_file() for image in images)
    assert opened.errors == []
    opened.page.close()


@pytest.mark.slow
def test_hostile_prompts_show_as_text_and_never_run(browser: Browser, batch_folder: Path) -> None:
    opened = open_gallery(browser, batch_folder)
    opened.shown("all/1")
    page = opened.page
    prompts = page.eval_on_selector_all(".prompt", "ps => ps.map(p => p.textContent)")
    assert HOSTILE in prompts
    assert HOSTILE_2.replace("\u2028", "\\u2028") in prompts  # a line separator, shown
    assert HOSTILE in page.inner_text("#grid")
    ids = page.eval_on_selector_all(".meta dd", "dds => dds.map(d => d.textContent)")
    assert HOSTILE_ID in ids
    page.wait_for_timeout(200)  # time for an injected handler to fire, if there were one
    assert opened.dialogs == []
    assert page.evaluate("window.pwned") is None
    # Our two script elements only (page files remove theirs once run), and every image
    # is one of the batch's files.
    assert page.evaluate("document.scripts.length") == 2
    srcs = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.getAttribute('src'))")
    assert all((batch_folder / src).is_file() for src in srcs)
    assert opened.errors == []  # no script error, no Content-Security-Policy refusal
    local = batch_folder.as_uri() + "/"  # every request the page made: a file of the gallery
    assert opened.requests
    assert all(url.startswith(local) for url in opened.requests), opened.requests
    page.close()


def test_header_counts_and_totals(browser: Browser, batch: Batch) -> None:
    opened = open_gallery(browser, batch.folder)
    opened.shown("all/1")
    counts = {
        name: opened.page.inner_text(f'[data-filter="{name}"] .count')
        for name in ("all", "succeeded", "failed", "expired", "unfinished")
    }
    assert counts == {
        "all": "7",
        "succeeded": "5",
        "failed": "2",
        "expired": "0",
        "unfinished": "0",
    }
    assert opened.page.inner_text("h1") == "Spring set"
    assert opened.page.title() == "Spring set"
    totals = opened.page.inner_text("#totals")
    assert batch.credits > 0
    assert totals.startswith(f"7 lines · {batch.credits:g} credits ·")
    opened.page.close()


@pytest.mark.slow
def test_filters_change_the_cards(browser: Browser, batch_folder: Path) -> None:
    opened = open_gallery(browser, batch_folder)
    page = opened.page
    opened.shown("all/1")
    assert [c["line"] for c in opened.cards()] == ["1", "2", "3", "4", "5", "6", "7"]
    page.click('[data-filter="failed"]')
    opened.shown("failed/1")
    assert opened.cards() == [{"line": "3", "status": "failed"}, {"line": "4", "status": "failed"}]
    notes = page.eval_on_selector_all(".note .code", "codes => codes.map(c => c.textContent)")
    assert notes == ["generation_failed", "invalid_line"]
    assert page.get_attribute('[data-filter="failed"]', "aria-pressed") == "true"
    page.click('[data-filter="succeeded"]')
    opened.shown("succeeded/1")
    assert [c["line"] for c in opened.cards()] == ["1", "2", "5", "6", "7"]
    page.click('[data-filter="expired"]')
    opened.shown("expired/1")
    assert opened.cards() == []
    assert page.is_visible("#empty")
    page.go_back()  # filters are in the address: Back returns to the previous one
    opened.shown("succeeded/1")
    page.close()


def card_meta(page: Page, line: int) -> dict[str, str]:
    """A card's details as shown: each <dt> name with the text of its <dd>."""
    found: dict[str, str] = page.eval_on_selector(
        f'.card[data-line="{line}"] .meta',
        """dl => Object.fromEntries(Array.from(dl.querySelectorAll("dt"))
                  .map(dt => [dt.textContent, dt.nextElementSibling.innerText]))""",
    )
    return found


def test_a_collected_task_shows_its_surface_and_a_skipped_line_what_was_wrong(
    browser: Browser, batch_folder: Path
) -> None:
    records = {r["line"]: r for r in iter_manifest(batch_folder / "manifest.jsonl")}
    opened = open_gallery(browser, batch_folder)
    opened.shown("all/1")
    page = opened.page
    collected = card_meta(page, 7)
    assert (collected["task"], collected["surface"]) == (records[7]["task_id"], "alpha")
    assert page.inner_text('.card[data-line="7"] .prompt') == COLLECTED
    assert card_meta(page, 1)["surface"] == "beta"  # the run's own tasks say theirs too
    # The bad input line: what was wrong with it where its prompt would be.
    reason = records[4]["error"]["message"]
    assert "JSON" in reason
    assert page.inner_text('.card[data-line="4"] .prompt') == reason
    assert page.inner_text('.card[data-line="4"] .note .code') == "invalid_line"
    assert "never sent" in page.inner_text('.card[data-line="4"] .note .message')
    assert "surface" not in card_meta(page, 4)  # no task: no surface to speak of
    assert "no prompt recorded" not in page.inner_text("#grid")
    assert opened.errors == []
    page.close()


# The left edge of every character of an element's text, in the order the text holds them,
# as Chromium laid them out.
CHARACTER_LEFTS = """el => {
  const lefts = [];
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.data.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getBoundingClientRect();
      if (box.width > 0) lefts.push(box.left);
    }
  }
  return lefts;
}"""
FLAG = "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"  # Scotland's


def test_bidi_controls_and_invisible_characters_show_as_codes_in_logical_order(
    browser: Browser, tmp_path: Path
) -> None:
    waiting = {"status": "running", "files": []}
    records = [
        record(1, prompt=f"a cat {RLO}evil", id=f"id {RLO}olleh", **waiting),
        record(2, prompt="שלום, a fox in the snow", **waiting),
        record(3, prompt=f"{FLAG} zero\u200bwidth\u2066hidden\u2069 tab\there", **waiting),
        record(4, status=f"{RLO}gninnur", files=[], task_id=None),
    ]
    write_gallery(tmp_path, records, title=f"Spring {RLO}set")
    opened = open_gallery(browser, tmp_path)
    opened.shown("all/1")
    page = opened.page
    evil = page.locator('.card[data-line="1"] .prompt')
    # The override is shown as its code, and reverses nothing: the prompt reads as it was
    # written, every character right of the one before.
    assert evil.inner_text() == "a cat \\u202eevil"
    assert evil.locator(".invisible").inner_text() == "\\u202e"
    lefts = evil.evaluate(CHARACTER_LEFTS)
    assert len(lefts) == len("a cat \\u202eevil")  # every character laid out, on one line
    assert all(a < b for a, b in itertools.pairwise(lefts)), lefts
    assert card_meta(page, 1)["id"] == "id \\u202eolleh"
    assert card_meta(page, 1)["id"] != "id hello"
    # No raw control anywhere on the page: not in its text, its attributes or its title.
    text = page.evaluate("document.body.innerText")
    attributes = page.evaluate(
        """Array.from(document.querySelectorAll("*")).flatMap(
             e => Array.from(e.attributes).map(a => a.value))"""
    )
    for value in [text, page.title(), *attributes]:
        assert not RAW_HIDDEN.search(value), value
    assert page.title() == page.inner_text("h1") == "Spring \\u202eset"
    assert page.get_attribute('.card[data-line="1"] .meta dd[title^="id"]', "title") == (
        "id \\u202eolleh"
    )
    assert page.inner_text('.card[data-line="4"] .badge').endswith("\\u202egninnur")
    # Right-to-left text keeps its own direction, isolated from the card around it.
    directions = page.eval_on_selector_all(
        ".prompt", "ps => ps.map(p => [getComputedStyle(p).direction, p.dir])"
    )
    assert directions[:2] == [["ltr", "auto"], ["rtl", "auto"]]
    # A flag's tags draw the flag; other invisible characters show, tab and all else kept.
    third = page.locator('.card[data-line="3"] .prompt')
    assert third.evaluate("p => p.textContent") == (
        f"{FLAG} zero\\u200bwidth\\u2066hidden\\u2069 tab\there"
    )
    assert third.locator(".invisible").all_inner_texts() == ["\\u200b", "\\u2066", "\\u2069"]
    assert opened.errors == []
    page.close()


def test_cut_prompts_are_described_by_one_rule(browser: Browser, tmp_path: Path) -> None:
    foxes = "\U0001f98a" * 20_000  # two UTF-16 units each: still 20,000 characters
    write_gallery(
        tmp_path,
        [record(1, prompt=foxes), record(2, prompt="x" * 18_704), record(3, prompt="short")],
    )
    opened = open_gallery(browser, tmp_path)
    opened.shown("all/1")
    page = opened.page
    assert page.eval_on_selector_all(".cut", "cs => cs.map(c => c.textContent)") == [
        "first 2,000 of 20,000 characters; the manifest has them all",
        "first 2,000 of 18,704 characters; the manifest has them all",
    ]
    assert page.eval_on_selector_all(".prompt", "ps => ps.map(p => p.title)") == [
        "Click to show the first 2,000 of 20,000 characters",
        "Click to show the first 2,000 of 18,704 characters",
        "Click to show the whole prompt",
    ]
    shown = page.eval_on_selector_all(".prompt", "ps => ps.map(p => [...p.textContent].length)")
    assert shown == [2_000, 2_000, 5]
    page.close()


def colours(browser: Browser, shot: bytes) -> tuple[int, float]:
    """Distinct colours of a PNG and the share of pixels unlike its most common colour,
    decoded by the browser's own PNG decoder on a canvas."""
    page = browser.new_page()
    result: list[float] = page.evaluate(
        """async (b64) => {
             const img = new Image();
             img.src = "data:image/png;base64," + b64;
             await img.decode();
             const canvas = document.createElement("canvas");
             canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
             const ctx = canvas.getContext("2d");
             ctx.drawImage(img, 0, 0);
             const px = new Uint32Array(ctx.getImageData(0, 0, canvas.width, canvas.height).data.buffer);
             const seen = new Map();
             for (const p of px) seen.set(p, (seen.get(p) || 0) + 1);
             const top = Math.max(...seen.values());
             return [seen.size, 1 - top / px.length];
           }""",
        base64.b64encode(shot).decode("ascii"),
    )
    page.close()
    return int(result[0]), result[1]


@pytest.mark.slow
def test_screenshot_has_content(browser: Browser, batch_folder: Path) -> None:
    opened = open_gallery(browser, batch_folder)
    opened.shown("all/1")
    opened.images_loaded()
    # IMGGW_GALLERY_SCREENSHOT=path keeps a copy to look at (pytest's own folders rotate).
    keep = os.environ.get("IMGGW_GALLERY_SCREENSHOT") or batch_folder / "gallery-screenshot.png"
    shot = opened.page.screenshot(path=str(keep))
    opened.page.close()
    blank = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    blank_shot = blank.screenshot()
    blank.close()
    assert colours(browser, blank_shot)[0] == 1  # the measure sees a blank page as blank
    distinct, busy = colours(browser, shot)
    assert distinct > 500  # text, badges and the gradient images
    assert busy > 0.2  # not a white page with a few marks


# ---------------------------------------------------------------------------- 10,000 lines


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gallery-10k")
    ratios = ["16:9", "1:1", "9:16", "4:3"]
    for n, ratio in enumerate(ratios):
        w, h = (int(x) for x in ratio.split(":"))
        size = (96, round(96 * h / w)) if w >= h else (round(96 * w / h), 96)
        (folder / f"{n}.png").write_bytes(png(*size, seed=0x3A7F21 * (n + 1)))

    def records() -> Iterator[dict[str, Any]]:
        for line in range(1, 10_001):
            if line % 50 == 0:
                yield record(
                    line,
                    status="failed",
                    files=[],
                    error={"code": "content_policy", "message": "refused"},
                )
            else:
                n = line % len(ratios)
                yield record(
                    line,
                    aspect_ratio=ratios[n],
                    files=[{"path": f"{n}.png", "sha256": "0" * 64, "size": 1}],
                )

    write_gallery(folder, records())
    return folder


@pytest.mark.slow
def test_ten_thousand_lines_open_with_one_page_of_cards(browser: Browser, big_folder: Path) -> None:
    opened = open_gallery(browser, big_folder)
    opened.shown("all/1")
    # Quick to open by count, not by the clock: one page of cards in the document, not 10,000.
    assert len(opened.cards()) == PAGE_SIZE
    assert opened.page.inner_text('[data-filter="all"] .count') == "10,000"
    opened.images_loaded()
    # Lazy loading: only the images near the screen are fetched, not the page's 196.
    fetched = [url for url in opened.requests if url.endswith(".png")]
    assert 0 < len(fetched) < 100
    # Page files: this page and the next one (fetched ahead), nothing else.
    assert sorted(url.rsplit("/", 2)[-2:][1] for url in opened.requests if url.endswith(".js")) == [
        "1.js",
        "2.js",
    ]
    local = big_folder.as_uri() + "/"  # every request the page made: a file of the gallery
    assert all(url.startswith(local) for url in opened.requests), opened.requests
    opened.page.close()


@pytest.mark.slow
def test_paging_through_ten_thousand_lines(browser: Browser, big_folder: Path) -> None:
    opened = open_gallery(browser, big_folder)
    page = opened.page
    opened.shown("all/1")
    assert page.is_disabled("#pager-top .prev")
    page.click("#pager-top .next")
    opened.shown("all/2")
    assert opened.cards()[0]["line"] == "201"
    assert page.inner_text("#pager-top .range") == "cards 201\u2013400"
    assert page.input_value("#pager-top input") == "2"
    page.fill("#pager-top input", "50")
    page.press("#pager-top input", "Enter")
    opened.shown("all/50")
    assert [c["line"] for c in opened.cards()][-1] == "10000"
    assert page.is_disabled("#pager-bottom .next")
    page.keyboard.press("ArrowLeft")
    opened.shown("all/49")
    page.click('[data-filter="failed"]')
    opened.shown("failed/1")
    cards = opened.cards()
    assert len(cards) == PAGE_SIZE
    assert {c["status"] for c in cards} == {"failed"}
    assert cards[0]["line"] == "50"
    assert not page.is_visible("#pager-top .next")  # a single page needs no pager
    assert opened.errors == []
    page.close()


@pytest.mark.slow
def test_a_page_open_across_two_rewrites_offers_a_reload(browser: Browser, tmp_path: Path) -> None:
    three_pages = [record(line, files=[]) for line in range(1, 2 * PAGE_SIZE + 2)]
    write_gallery(tmp_path, three_pages)
    opened = open_gallery(browser, tmp_path)
    page = opened.page
    opened.shown("all/1")
    write_gallery(tmp_path, three_pages)
    write_gallery(tmp_path, three_pages)  # the generation the page was opened on is gone now
    page.fill("#pager-top input", "3")
    page.press("#pager-top input", "Enter")
    opened.shown("stale")
    assert "rewritten" in page.inner_text("#notice")
    page.click("#notice button")
    opened.shown("all/3")  # the reloaded page, on the page that was asked for
    assert [c["line"] for c in opened.cards()] == [str(2 * PAGE_SIZE + 1)]
    page.close()
