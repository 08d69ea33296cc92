"""The page's data files (markup, style, script) and the policy that lets them run."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from importlib import resources
from pathlib import Path

from imggw_client.batch._gallery import (
    ASSETS_DIR,
    SCRIPT_FILE,
    STYLE_FILE,
    TEMPLATE_FILE,
    write_gallery,
)

from .helpers import record

ASSETS = resources.files("imggw_client.batch") / ASSETS_DIR
PLACEHOLDERS = ["@DATA@", "@POLICY@", "@SCRIPT@", "@STYLE@", "@TITLE@"]


def asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def test_the_data_files_are_plain_text_with_no_escape_read_by_accident() -> None:
    names = sorted(entry.name for entry in ASSETS.iterdir())
    assert names == sorted([TEMPLATE_FILE, STYLE_FILE, SCRIPT_FILE])
    for name in names:
        text = asset(name)
        # A `\n`, `\t` or `\u2713` that Python, not the browser, read would leave a control or
        # non-ASCII character behind; a line ending in a backslash is a Python continuation.
        assert re.fullmatch(r"[\x20-\x7e\n]*", text), name
        assert '"""' not in text, name
        assert not re.search(r"\\\n", text), name
    script = asset(SCRIPT_FILE)
    # The script's own escapes, written once for JavaScript to read: never escaped twice.
    assert 'ICONS = {succeeded: "\\u2713"' in script
    assert '"(\\\\u{1F3F4}[\\\\u{E0020}-\\\\u{E007E}]+\\\\u{E007F})|"' in script
    assert not re.search(r"\\{3}", script)
    # Inline, neither may end its element early.
    assert not re.search(r"</script|<!--", script, re.I)
    assert not re.search(r"</style", asset(STYLE_FILE), re.I)
    template = asset(TEMPLATE_FILE)
    assert sorted(re.findall(r"@[A-Z]+@", template)) == PLACEHOLDERS


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_the_policy_hashes_the_inline_script_and_style_of_a_written_page(tmp_path: Path) -> None:
    markup = write_gallery(tmp_path, [record(1)], title="@STYLE@").read_text(encoding="utf-8")
    (policy,) = re.findall(r'http-equiv="Content-Security-Policy" content="([^"]*)"', markup)
    rules = dict(rule.strip().split(" ", 1) for rule in html.unescape(policy).split(";"))
    (style,) = re.findall(r"<style>(.*?)</style>", markup, re.S)
    (script,) = re.findall(r"<script>(.*?)</script>", markup, re.S)
    assert rules["style-src"] == sha256(style)
    assert rules["script-src"] == "'self' file: " + sha256(script)
    # The files, inlined as they are.
    assert (style, script) == (asset(STYLE_FILE), asset(SCRIPT_FILE))
    assert "<title>@STYLE@</title>" in markup
