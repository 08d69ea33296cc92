"""The docs are run, not just read: the site builds with ``mkdocs build --strict``; every
``python`` block of README.md and docs/ runs against the reference gateway, in order, page by
page, as a reader would run them, and passes ``mypy --strict``; every program in examples/ has a
test that runs it; every public name has its entry in the API reference; the README keeps its
Quickstart within 300 lines and its links lead somewhere."""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import re
import subprocess
import symtable
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, Client
from imggw_client.mock import MockGateway

from . import PUBLIC_MODULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
KEY = "sk-docs-key-7d1e"
# What the blocks' environment must not inherit from the shell running the tests.
# The Quickstart's first command: a fresh clone to a saved image, with no key and no network.
FIRST_STEP = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && "
    '.venv/bin/imggw generate --mock "a lighthouse at dusk" -a 16:9 -o out'
)
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>.*\S.*) -->")
FILE = re.compile(r"<!-- file: (?P<name>[\w.-]+) -->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")


@dataclass
class Block:
    """A fenced block of a page: its language, first line of code (1-based) and text."""

    page: Path
    lang: str
    line: int
    code: str
    marker: str  # the HTML comment on the line before the fence, or ""

    @property
    def where(self) -> str:
        return f"{shown(self.page)}:{self.line}"


def shown(page: Path) -> str:
    return str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, dedented (a block may sit in a list item)."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = opening["indent"]
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].rstrip() == f"{indent}```"), None
        )
        assert end is not None, f"{page.relative_to(ROOT)}:{i + 1}: a fence never closed"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end])
        marker = before if before.startswith("<!--") else ""
        found.append(Block(page, opening["lang"], i + 2, code + "\n", marker))
        i = end + 1
    return found


def run_page(page: Path, cwd: Path) -> int:
    """Runs the page's python blocks in order in one namespace, in ``cwd``; a ``file:``
    block is written there first. Returns how many blocks ran; a block that raises fails
    the test, naming its page and line, with the traceback's lines in the page's numbers."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    ran = 0
    try:
        for block in blocks(page):
            written = FILE.fullmatch(block.marker)
            if written is not None:
                (cwd / written["name"]).write_text(block.code)
                continue
            if block.lang != "python" or NOT_RUN.fullmatch(block.marker):
                continue
            # Blank lines before the code: the traceback's line numbers are the page's.
            code = compile("\n" * (block.line - 1) + block.code, str(block.page), "exec")
            try:
                exec(code, namespace)
            except BaseException as exc:
                shown = "".join(traceback.format_exception(exc))
                pytest.fail(f"the block at {block.where} fails:\n{shown}", pytrace=False)
            ran += 1
    finally:
        close_clients(namespace)
    return ran


def close_clients(namespace: dict[str, object]) -> None:
    """Closes what the page left open, as the end of a reader's program would."""
    for value in namespace.values():
        if isinstance(value, Client):
            value.close()
        elif isinstance(value, AsyncClient) and not value.is_closed:
            anyio.run(value.close)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


RUN_PAGES = [page for page in PAGES if any(b.lang == "python" for b in blocks(page))]


# Seconds a page: the blocks wait on real tasks over a socket, with the default poll policy.
@pytest.mark.gateway(api_keys=[KEY], duration_min=0.05, duration_max=0.2)
@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=page_id)
def test_every_python_block_of_the_page_runs(page: Path, env_gateway: MockGateway) -> None:
    ran = run_page(page, Path.cwd())
    assert ran > 0, f"{page_id(page)}: every python block is marked not run"


def test_a_block_that_breaks_fails_naming_its_page_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n<!-- file: names.txt -->\n```text\nfox\n```\n\n"
        "```python\nfrom pathlib import Path\nname = Path('names.txt').read_text().strip()\n```\n\n"
        "<!-- not run: shows a failure -->\n```python\n1 / 0\n```\n\n"
        "```python\nassert name == 'fox'\nmissing_name\n```\n"
    )
    with pytest.raises(pytest.fail.Exception) as failed:
        run_page(page, tmp_path)
    said = str(failed.value)
    assert f"the block at {page}:19 fails" in said
    assert "NameError: name 'missing_name' is not defined" in said
    assert f'"{page}", line 20' in said  # the traceback counts the page's lines
    assert "ZeroDivisionError" not in said  # a block marked not run is not run


def test_blocks_not_run_are_few_and_each_says_why() -> None:
    skipped = [b for page in PAGES for b in blocks(page) if b.lang == "python" and b.marker]
    for block in skipped:
        assert NOT_RUN.fullmatch(block.marker), f"{block.where}: {block.marker!r}"
    runnable = [b for page in PAGES for b in blocks(page) if b.lang == "python"]
    assert len(skipped) * 5 <= len(runnable), [b.where for b in skipped]  # sparingly


# What the blocks are checked with: what a reader's type checker says of them, strictly.
MYPY_INI = """\
[mypy]
strict = True
python_version = 3.10

[mypy-docblocks.*]
# A block takes the names of the blocks before it from their modules (see typed_modules).
implicit_reexport = True

[mypy-opentelemetry.exporter.*]
# The OTLP exporter is the reader's to choose and install (its block is not run).
ignore_missing_imports = True
"""


def free_names(code: str) -> set[str]:
    """The global names a block reads and does not bind: what it takes from the blocks before
    it, as its page's namespace hands them over when the page runs."""
    top = symtable.symtable(code, "<block>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        read |= {
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and (table is top or s.is_global())
        }
    return read - bound - set(dir(builtins))


def typed_modules(pages: list[Path], folder: Path) -> dict[str, Path]:
    """Writes every python block of ``pages`` (those not run too) as a module of the package
    ``docblocks`` in ``folder``; returns each module's path, relative to ``folder``, and its page.

    Each block is a module of its own, so that a block may bind a name again with another type
    as a reader's next program would. The names it takes from the blocks before it (run ones:
    as when the page runs) it imports from the module of the block that last bound them, on its
    first line; its code starts on the page's line, so mypy's line numbers are the page's."""
    package = folder / "docblocks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    written: dict[str, Path] = {}
    for number, page in enumerate(pages):
        binder: dict[str, str] = {}  # a name -> the module of the run block that last bound it
        for index, block in enumerate(blocks(page)):
            if block.lang != "python" or FILE.fullmatch(block.marker):
                continue
            module = f"page{number}_block{index}"
            taken: dict[str, list[str]] = {}
            for name in sorted(free_names(block.code)):
                if name in binder:
                    taken.setdefault(binder[name], []).append(name)
            header = "; ".join(
                f"from docblocks.{m} import {', '.join(n)}" for m, n in taken.items()
            )
            (package / f"{module}.py").write_text(header + "\n" * (block.line - 1) + block.code)
            written[f"docblocks/{module}.py"] = page
            if not NOT_RUN.fullmatch(block.marker):
                top = symtable.symtable(block.code, module, "exec")
                for symbol in top.get_symbols():
                    if symbol.is_assigned() or symbol.is_imported():
                        binder[symbol.get_name()] = module
    return written


def type_errors(pages: list[Path], folder: Path) -> list[str]:
    """What one ``mypy --strict`` run over every python block of ``pages`` reports, each line
    naming the block's page and the page's line."""
    written = typed_modules(pages, folder)
    (folder / "mypy.ini").write_text(MYPY_INI)
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "mypy.ini",
            "--cache-dir",
            ".cache",
            "--no-error-summary",
            "docblocks",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert checked.returncode in (0, 1), checked.stdout + checked.stderr
    errors = []
    for line in checked.stdout.splitlines():
        module, sep, rest = line.partition(":")
        errors.append(shown(written[module]) + sep + rest if module in written else line)
    return errors


# Seconds: mypy reads imggw and what it imports, with no cache.
@pytest.mark.slow
def test_every_python_block_passes_mypy_strict(tmp_path: Path) -> None:
    errors = type_errors(PAGES, tmp_path)
    assert not errors, "\n".join(errors)


@pytest.mark.slow
def test_a_type_error_in_a_block_names_its_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n```python\ncount = 1\n```\n\n"
        "<!-- not run: needs a service -->\n```python\nlabel = 'one'\ncount = 'two'\n```\n\n"
        "```python\ntotal: str = count\nlabel.upper()\n```\n\n"
        "```python\ncount = 'a name again'\n```\n"
    )
    assert type_errors([page], tmp_path / "checked") == [
        f'{page}:14: error: Incompatible types in assignment (expression has type "int", '
        'variable has type "str")  [assignment]',
        f'{page}:15: error: Name "label" is not defined  [name-defined]',
    ]


def test_every_example_has_a_test_that_runs_it() -> None:
    tests = (ROOT / "tests" / "project" / "test_examples.py").read_text()
    for example in sorted((ROOT / "examples").glob("*.py")):
        assert f'"{example.name}"' in tests, f"examples/{example.name} is run by no test"


def test_every_public_name_has_its_entry_in_the_api_reference() -> None:
    reference = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    entries = set(re.findall(r"^::: ([\w.]+)", reference, re.M))
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        if module_name in entries and module_name != "imggw_client":
            continue  # the whole module, every name of its __all__
        for name in module.__all__:
            if name.startswith("__"):
                continue
            assert f"{module_name}.{name}" in entries, f"{module_name}.{name} is not in docs/"


def test_the_readme_is_short_and_keeps_its_two_command_quickstart() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    quickstart = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    (commands,) = [b.code for b in blocks(ROOT / "README.md") if b.code in quickstart]
    steps = [line for line in commands.splitlines() if not line.startswith("#")]
    assert len(steps) == 2  # the second, the test command, is checked by test_test_command.py
    assert steps[0] == FIRST_STEP


def slug(heading: str) -> str:
    """A heading's anchor, as Python-Markdown's toc makes it (and GitHub, for plain words)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readmes_links_lead_to_pages_and_headings_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, link


# Seconds: mkdocstrings reads the whole package.
@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    for page in (
        "client",
        "apps",
        "shell",
        "batches",
        "collecting",
        "scale-out",
        "production",
        "gateway",
        "development",
        "reference/client",
    ):
        assert (site / page / "index.html").is_file(), page
    reference = (site / "reference" / "client" / "index.html").read_text()
    for name in ("Client.with_options", "AsyncClient.read", "Client.open", "Surface"):
        assert f'id="imggw_client.{name}"' in reference, name


def test_python_blocks_parse() -> None:
    """Cheap, in the fast lane: a block that is not even Python fails here first."""
    for page in PAGES:
        for block in blocks(page):
            if block.lang != "python" or FILE.fullmatch(block.marker):
                continue
            try:
                ast.parse(block.code)
            except SyntaxError as err:
                pytest.fail(f"{block.where}: not valid Python ({err.msg}, line {err.lineno})")
