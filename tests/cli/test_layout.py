"""The CLI's shape (DESIGN 13): it uses the SDK through public names only, ``batch`` is a real
sub-app, and ``imggw --help`` stays light. (Module sizes: ``tests/project/test_module_sizes.py``.)

The imports are read from the source with ``ast``, anywhere in a module (inside functions and
under ``if TYPE_CHECKING:`` too): a lazy import is still a dependency on what it names.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import typer.main
from typer.core import TyperGroup

from imggw_cli._app import app

SRC = Path(__file__).resolve().parents[2] / "src"
CLI = SRC / "imggw_cli"

# Empty: the CLI uses public names only. Nothing may join this list without a reason written
# beside it (the test fails on an entry no longer used).
WAITING_FOR_THE_BATCH_REWRITE: set[tuple[str, str]] = set()

# What `imggw --help` and `--version` must not load: they start as fast as a bare Typer app.
HEAVY = ("httpx", "pydantic", "rich", "imggw_client.batch")


def is_module(dotted: str) -> bool:
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private(part: str, *, module: bool) -> bool:
    """An underscore name is private; a dunder one (``__version__``) is not, unless it is a
    module (``__main__``: the SDK's entry point, not an API)."""
    dunder = part.startswith("__") and part.endswith("__")
    return part.startswith("_") and (module or not dunder)


def private_uses(path: Path) -> Iterator[str]:
    """Every private SDK module or name ``path`` imports or reaches by attribute, dotted
    (``imggw_client._core.text.printable``), and every ``obj._name`` it reads on anything but
    one of its own sibling modules (``_exit.code_for``) or ``self``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: dict[str, str] = {}  # a name bound to an SDK module -> that module
    siblings = {"self"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "imggw_client":
                    continue
                parts = alias.name.split(".")
                if any(private(p, module=True) for p in parts):
                    yield alias.name
                modules[alias.asname or parts[0]] = alias.name if alias.asname else parts[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # our own modules
                siblings.update(alias.asname or alias.name for alias in node.names)
                continue
            base = node.module or ""
            if base.split(".")[0] != "imggw_client":
                continue
            base_private = any(private(p, module=True) for p in base.split("."))
            for alias in node.names:
                dotted = f"{base}.{alias.name}"
                submodule = is_module(dotted)
                if base_private or private(alias.name, module=submodule):
                    yield dotted
                if submodule:
                    modules[alias.asname or alias.name] = dotted
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain = [node.attr]
        inner = node.value
        while isinstance(inner, ast.Attribute):
            chain.insert(0, inner.attr)
            inner = inner.value
        if not isinstance(inner, ast.Name):
            continue
        if inner.id in modules:
            if any(private(p, module=False) for p in chain):
                yield ".".join([modules[inner.id], *chain])
        elif inner.id not in siblings and private(node.attr, module=False):
            yield f"{inner.id}.{'.'.join(chain)}"


def test_the_cli_uses_only_public_names_of_the_sdk() -> None:
    found = {(path.name, name) for path in sorted(CLI.glob("*.py")) for name in private_uses(path)}
    for _, name in WAITING_FOR_THE_BATCH_REWRITE:
        assert name.startswith("imggw_client.batch._"), f"{name}: not a batch internal"
    unexpected = sorted(found - WAITING_FOR_THE_BATCH_REWRITE)
    assert not unexpected, (
        f"private names used by the CLI: {unexpected}; make what the CLI needs public (and "
        "documented) in imggw_client instead"
    )
    stale = sorted(WAITING_FOR_THE_BATCH_REWRITE - found)
    assert not stale, f"no longer imported, remove from the allow-list: {stale}"


def test_the_reader_sees_every_kind_of_private_use(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import imggw_client\n"
        "import imggw_client._core.text\n"
        "import imggw_client as sdk\n"
        "from imggw_client import Client, __version__, rules\n"
        "from imggw_client import _download\n"
        "from imggw_client._core.config import MIN_RATE\n"
        "from imggw_client.mock.__main__ import main\n"
        "from imggw_client.batch import _ledger\n"
        "from . import _exit\n"
        "def f(client, ctx):\n"
        "    from imggw_client.text import printable\n"
        "    sdk._core, imggw_client.__version__, rules.ASPECT_RATIOS, rules._NON_BLANK\n"
        "    client._conn, _exit.code_for, Client.make_http_client\n"
    )
    assert sorted(private_uses(sample)) == [
        "client._conn",
        "imggw_client._core",
        "imggw_client._core.config.MIN_RATE",
        "imggw_client._core.text",
        "imggw_client._download",
        "imggw_client.batch._ledger",
        "imggw_client.mock.__main__.main",
        "imggw_client.rules._NON_BLANK",
    ]


def test_batch_is_a_real_sub_app_and_the_root_resolves_commands_as_typer_does() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    assert type(root).resolve_command is TyperGroup.resolve_command
    assert not any(" " in name for name in root.commands)  # no "batch merge" on the root
    batch = root.commands["batch"]
    assert isinstance(batch, TyperGroup)
    assert set(batch.commands) == {"merge", "status"}
    names = list(root.commands)
    assert names == [
        "generate",
        "submit",
        "status",
        "poll",
        "wait",
        "download",
        "tasks",
        "batch",
        "gallery",
        "mock",
        "completion",
    ]
    assert set(root.commands["tasks"].commands) == {"collect", "prune"}  # type: ignore[attr-defined]


def test_help_and_version_load_no_heavy_module() -> None:
    for flag in ("--help", "--version"):
        code = (
            "import sys\n"
            f"sys.argv = ['imggw', {flag!r}]\n"
            "from imggw_cli import main\n"
            "try:\n"
            "    main()\n"
            "except SystemExit:\n"
            "    pass\n"
            f"heavy = {HEAVY!r}\n"
            "loaded = sorted(m for m in sys.modules if m in heavy or m.startswith("
            "tuple(h + '.' for h in heavy)))\n"
            "sys.stderr.write(repr(loaded))\n"
        )
        # Without the httpx2 lane's PYTHONPATH, whose start-up imports httpx on purpose.
        env = {**os.environ, "PYTHONPATH": ""}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == "[]", (flag, done.stderr)
