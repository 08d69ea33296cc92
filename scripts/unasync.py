"""Generates the blocking client, ``src/imggw_client/_client.py``, from the asynchronous one.

    python scripts/unasync.py            # writes _client.py
    python scripts/unasync.py --check    # exit 1 and a diff when the committed file differs

``_async_client.py`` is the single source. The generated text is made in four steps:

1. ``unasync`` (token-based) drops ``async`` and ``await`` and renames names: the defaults
   (``__aenter__`` -> ``__enter__``, ...) and :data:`NAMES`. Strings and comments keep their
   words, except a string that is one name only.
2. A prose pass, for docstrings and comments, which unasync leaves alone: the phrases of
   :data:`PASSAGES` (each must occur exactly as written, so a reworded docstring fails here
   instead of leaking async words into the sync client), then the words of :data:`WORDS`.
   The result must not mention ``await``, ``async``, anyio or coroutines anywhere.
3. The header comment that says where the file comes from.
4. ``ruff`` sorts the imports the renames unsorted, joins the ``with`` statements that a
   dropped ``async`` lets stand as one, and formats the lines the dropped keywords shortened,
   as it formats every other file.

``--check`` compares the final text with the file; a test in the suite runs it, so CI fails on
any drift. Every way in which the clients differ lives in ``_io_async.py`` and ``_io_sync.py``,
which this script maps one onto the other: they are written by hand.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# This script bears the package's name and Python puts its folder first on the path: drop the
# folder, so that the import below finds the package, not this file.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
import unasync  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "imggw_client" / "_async_client.py"
TARGET = ROOT / "src" / "imggw_client" / "_client.py"
COMMAND = "python scripts/unasync.py"

# Names (tokens) beyond unasync's own. Its rule "AsyncX -> SyncX" would misname httpx's.
NAMES = {
    "AsyncClient": "Client",
    "AsyncBaseTransport": "BaseTransport",
    "aclose": "close",
    "aiter_bytes": "iter_bytes",
    "_io_async": "_io_sync",
    "BudgetService": "SyncBudgetService",
}

# Whole phrases of the async docstrings that the sync client says otherwise (or not at all).
PASSAGES = [
    (
        "the I/O of ``_io_async``.\n\n"
        "This file is the single source of both clients: ``scripts/unasync.py`` generates the"
        " other\nfrom it. Every way in which the two differ lives in ``_io_async`` (and its"
        " twin): edit this\nfile, then run the script.",
        "the I/O of ``_io_sync``.\n\n"
        "Generated from ``_async_client.py``, the single source of both clients (see the"
        " comment\nabove): every way in which the two differ lives in ``_io_sync`` and its"
        " twin.",
    ),
    (
        "The asynchronous imggw client: the same API as :class:`Client`, awaited.",
        "The blocking imggw client.",
    ),
    ("Share one client between tasks.", "Thread-safe: share one client between threads."),
    (
        "    An ``AsyncClient`` may be used under one event loop after another (several\n"
        "    ``asyncio.run()`` calls), or several at once (threads): each loop gets an HTTP"
        " client of\n"
        "    its own, closed on that loop as its run ends. A caller's own ``http_client``, or a\n"
        "    transport that pools connections (``httpx.AsyncHTTPTransport``), belongs to its"
        " loop: using\n"
        "    it under another raises :class:`ConfigurationError` before anything is sent.\n\n",
        "",
    ),
    (" (a coroutine it returns is awaited)", ""),
    ("whose methods this client awaits", "whose methods this client calls"),
    ("from another task,", "from another thread,"),
]

# Words of examples and prose, wherever they stand.
WORDS = [
    (r"\bawait ", ""),
    (r"\basync with ", "with "),
    (r"\basync for ", "for "),
    (r"\basync def ", "def "),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bBudgetService\b", "SyncBudgetService"),
    (r"\b_io_async\b", "_io_sync"),
]

FORBIDDEN = re.compile(r"\b(async|await\w*|anyio|asyncio|trio|coroutines?|AsyncClient)\b")

HEADER = f"""\
# Generated from src/imggw_client/_async_client.py by `{COMMAND}`: do not edit.
# Edit that file (or the primitives in _io_async.py / _io_sync.py) and run the command again;
# `{COMMAND} --check` (run by tests/client/test_sync_generated.py) fails while the
# two differ.
# This file mirrors _async_client.py line for line by design: a duplicate finder pairs them.
"""


class GenerationError(Exception):
    """The async source no longer fits the rules above."""


def unasync_tokens(source: str) -> str:
    """Step 1, through unasync's public API (it works on files in an ``_async`` folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "_async"
        folder.mkdir()
        (folder / "client.py").write_text(source, encoding="utf-8")
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=NAMES)
        unasync.unasync_files([str(folder / "client.py")], [rule])
        return (Path(tmp) / "_sync" / "client.py").read_text(encoding="utf-8")


def prose(text: str) -> str:
    """Step 2."""
    for old, new in PASSAGES:
        if text.count(old) != 1:
            raise GenerationError(f"the passage {old[:60]!r}... is not in the source once")
        text = text.replace(old, new)
    for pattern, new in WORDS:
        text = re.sub(pattern, new, text)
    leaks = sorted({m.group(0) for m in FORBIDDEN.finditer(text)})
    if leaks:
        raise GenerationError(f"the sync client would still say {leaks}: add them to PASSAGES")
    return text


def ruff(text: str) -> str:
    """Step 4, with the project's settings (as if the text were the target file)."""
    fixes = ["check", "--fix", "--select", "I,SIM117", "--quiet"]
    for args in (fixes, ["format", "--quiet"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        if done.returncode != 0:
            raise GenerationError(f"ruff {args[0]} failed: {done.stderr.strip()}")
        text = done.stdout
    return text


def generate(source: Path = SOURCE) -> str:
    """The text ``_client.py`` must have."""
    return ruff(HEADER + prose(unasync_tokens(source.read_text(encoding="utf-8"))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--target", type=Path, default=TARGET, help="the file to write or check")
    args = parser.parse_args(argv)
    try:
        wanted = generate()
    except GenerationError as err:
        print(f"unasync: {err}", file=sys.stderr)
        return 2
    target: Path = args.target
    current = target.read_text(encoding="utf-8") if target.exists() else ""
    if not args.check:
        if current != wanted:
            target.write_text(wanted, encoding="utf-8")
            print(f"wrote {target}")
        return 0
    if current == wanted:
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            wanted.splitlines(keepends=True),
            f"{target} (as it is)",
            f"{target} (as {COMMAND} makes it)",
        )
    )
    print(f"\n{target} differs from what {SOURCE.name} gives: run `{COMMAND}`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
