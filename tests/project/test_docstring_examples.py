"""Every ``Example::`` block on the public API runs, as a reader would paste it (DESIGN 24).

The blocks are found where a reader meets them: the docstrings of the public modules, of each
name in their ``__all__`` and of the public members of those classes (inherited ones included).
Each runs in a folder of its own against the reference gateway on 127.0.0.1, named by the
environment as a user's would be, with the names the examples take for granted (their setting,
as docs/reference/client.md tells the reader): a ``client`` with a ``journal`` (an
``AsyncClient`` in a block that awaits), a finished ``task`` and its ``sub``, a ``gateway``,
``prompts`` and the input files ``prompts.jsonl``, ``prompts.csv`` and ``ids.txt``. A block
whose first line is ``# not run: <why>`` is only compiled; such blocks are few and each says
why. Private modules and helpers carry no examples at all.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import logging
import re
import signal
import sys
import textwrap
import time
import traceback
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import imggw_client
from imggw_client import AsyncClient, Client
from imggw_client.mock import MockGateway
from imggw_client.tracking import Journal

from . import PUBLIC_MODULES

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
KEY = "sk-docstring-examples-51c3"
# The longest a block may take: each waits on tasks of tens of milliseconds.
LONGEST = 60.0
NOT_RUN = re.compile(r"# not run: \S.*")


@dataclass(frozen=True)
class Example:
    """One ``Example::`` block: where it is documented and its code, dedented."""

    owner: str
    index: int
    code: str
    asynchronous: bool  # documented on AsyncClient itself: its client is an AsyncClient

    @property
    def name(self) -> str:
        return f"{self.owner}#{self.index}" if self.index else self.owner


def blocks(doc: str) -> list[str]:
    """The ``Example::`` blocks of a docstring, each dedented."""
    lines = inspect.cleandoc(doc).splitlines()
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "Example::":
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        j = i + 1
        while j < len(lines) and (
            not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
        ):
            j += 1
        found.append(textwrap.dedent("\n".join(lines[i + 1 : j])).strip("\n") + "\n")
        i = j
    return found


def documented(obj: object) -> str | None:
    """The docstring a reader sees for ``obj`` (a property's getter's, a method's function's)."""
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    return getattr(obj, "__doc__", None)


def members(cls: type) -> Iterator[tuple[str, object, type]]:
    """A public class's public members, inherited ones from imggw's own classes included, each
    with the class that documents it."""
    seen: set[str] = set()
    for base in cls.__mro__:
        if not base.__module__.startswith("imggw_client"):
            continue
        for name, value in vars(base).items():
            if name in seen or (name.startswith("_") and name != "__init__"):
                continue
            seen.add(name)
            yield name, value, base


def public_examples() -> list[Example]:
    """Every example of the public API, each docstring once."""
    found: list[Example] = []
    seen: set[str] = set()

    def take(owner: str, doc: str | None, asynchronous: bool = False) -> None:
        if not doc or doc in seen:
            return
        seen.add(doc)
        for index, code in enumerate(blocks(doc)):
            found.append(Example(owner, index, code, asynchronous))

    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        take(module_name, module.__doc__)
        for name in module.__all__:
            obj = getattr(module, name)
            take(f"{module_name}.{name}", documented(obj))
            if inspect.isclass(obj):
                for member, value, home in members(obj):
                    mine = home is AsyncClient
                    take(f"{module_name}.{name}.{member}", documented(value), mine)
    return found


EXAMPLES = public_examples()


def awaits(code: str) -> bool:
    """Whether a block awaits at its top level (it then runs in an event loop)."""
    compiled = compile(code, "<example>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    return bool(compiled.co_flags & inspect.CO_COROUTINE)


def setting(gateway: MockGateway, folder: Path) -> dict[str, Any]:
    """The names an example takes for granted, the public API's names among them."""
    namespace: dict[str, Any] = {"__name__": "__main__", "sys": sys, "time": time, "json": json}
    namespace.update({"httpx": httpx, "Hashable": Hashable, "Path": Path, "Any": Any})
    namespace["log"] = logging.getLogger("example")
    namespace["imggw_client"] = imggw_client
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        namespace.update({name: getattr(module, name) for name in module.__all__})
    journal = Journal(folder / "journal.sqlite")
    with Client(journal=journal) as client:
        sub = client.submit("a lighthouse at dusk")
        task = client.wait(sub)
    namespace.update(
        gateway=gateway,
        sub=sub,
        task=task,
        prompts=["a red fox in snow", "a lighthouse at dusk"],
        journal=journal,
    )
    (folder / "prompts.jsonl").write_text(
        '{"prompt": "a red fox in snow"}\n{"prompt": "a lighthouse", "aspect_ratio": "16:9"}\n'
    )
    (folder / "prompts.csv").write_text("prompt,aspect_ratio\na red fox in snow,3:2\n")
    (folder / "ids.txt").write_text(f"{task.id}\n")
    return namespace


def run(example: Example, namespace: dict[str, Any]) -> None:
    """Runs one block in ``namespace``; a block that awaits, or one ``AsyncClient`` documents
    itself, gets an ``AsyncClient`` made in its event loop, any other a ``Client``. ``sys.exit(0)`` is an
    end, any other exit a failure."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    code = compile(example.code, example.name, "exec", flags=flags)
    awaiting = bool(code.co_flags & inspect.CO_COROUTINE)

    def too_long(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {LONGEST:.0f} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, LONGEST)
    try:
        if awaiting or example.asynchronous:

            async def in_loop() -> None:
                async with AsyncClient(journal=namespace["journal"]) as client:
                    namespace.setdefault("client", client)
                    if awaiting:
                        await eval(code, namespace)
                    else:
                        exec(code, namespace)

            anyio.run(in_loop)
        else:
            with Client(journal=namespace["journal"]) as client:
                namespace.setdefault("client", client)
                exec(code, namespace)
    except SystemExit as end:
        if end.code not in (0, None):
            pytest.fail(f"{example.name} exits {end.code!r}:\n{example.code}", pytrace=False)
    except BaseException as exc:
        shown = "".join(traceback.format_exception(exc))
        pytest.fail(f"{example.name} fails:\n{example.code}\n{shown}", pytrace=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for value in namespace.values():
            if isinstance(value, Client):
                value.close()


# Seconds in all: each block waits on real tasks over a socket.
@pytest.mark.gateway(api_keys=[KEY], duration_min=0.02, duration_max=0.05, seed=3)
@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_the_example_runs(example: Example, env_gateway: MockGateway, tmp_path: Path) -> None:
    if NOT_RUN.match(example.code):
        compile(example.code, example.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        return
    run(example, setting(env_gateway, tmp_path))


def test_examples_not_run_are_few_and_each_says_why() -> None:
    skipped = [e.name for e in EXAMPLES if e.code.startswith("# not run")]
    assert all(NOT_RUN.match(e.code) for e in EXAMPLES if e.code.startswith("# not run"))
    assert len(skipped) * 5 <= len(EXAMPLES), skipped


def test_there_are_examples_to_run() -> None:
    # A collector that finds nothing would pass every example it did not find.
    assert len(EXAMPLES) >= 100
    assert {"imggw_client.Client.generate", "imggw_client.tracking.Journal"} <= {
        e.owner for e in EXAMPLES
    }


def test_private_code_carries_no_examples() -> None:
    public = {e.code for e in EXAMPLES}
    stray = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                continue
            doc = ast.get_docstring(node, clean=False)
            for code in blocks(doc) if doc else []:
                if code not in public:
                    where = getattr(node, "name", "(module)")
                    stray.append(f"{path.relative_to(ROOT)}: {where}")
    assert not stray, "examples no reader of the API meets:\n" + "\n".join(stray)


def test_awaits_tells_an_async_block_from_a_sync_one() -> None:
    assert awaits("task = await client.get('1')\n")
    assert awaits("async with AsyncClient() as c:\n    pass\n")
    assert not awaits("task = client.get('1')\n")
