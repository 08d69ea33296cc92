"""Nothing outside the client modules reads a client's private attributes (DESIGN 24, "Seams in
the open"): the batch runner, the tracker, the command line and the rest go through the
clients' public, documented accessors, so that a client's insides can change under them.

Read from the source with ``ast``: ``<expr>._name`` or ``getattr(<expr>, "_name")``, where
``_name`` is one of the clients' private attributes (those of ``Client`` and ``AsyncClient``
and those they set on themselves) and ``<expr>`` is not ``self``, ``cls`` or ``super()``,
anywhere under ``src/`` outside the modules that define the clients.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from imggw_client import AsyncClient, Client

SRC = Path(__file__).resolve().parents[2] / "src"
CLIENT_MODULES = {
    SRC / "imggw_client" / f"_{name}.py" for name in ("base_client", "async_client", "client")
}


def private(name: str) -> bool:
    """A name kept to its class: one underscore, not a dunder."""
    return name.startswith("_") and not name.startswith("__")


def client_privates() -> set[str]:
    """The clients' private attributes: their classes' and those they set on themselves."""
    names = {name for cls in (Client, AsyncClient) for name in dir(cls) if private(name)}
    for path in CLIENT_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _own(node.value) and private(node.attr):
                names.add(node.attr)
    return names


def _own(receiver: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: a class reading its own attributes."""
    if isinstance(receiver, ast.Call):
        receiver = receiver.func  # super()
    return isinstance(receiver, ast.Name) and receiver.id in ("self", "cls", "super")


def _read(node: ast.AST) -> tuple[ast.expr, object] | None:
    """What ``node`` reads an attribute of and the attribute's name, when it reads one:
    ``<expr>.name``, or ``getattr(<expr>, "name")`` (``setattr`` and ``hasattr`` too)."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "setattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
    ):
        return node.args[0], node.args[1].value
    return None


def private_reads(source: str, names: set[str]) -> Iterator[tuple[int, str]]:
    """Each line of ``source`` that reads one of ``names`` off something not itself."""
    for node in ast.walk(ast.parse(source)):
        read = _read(node)
        if read is not None and read[1] in names and not _own(read[0]):
            yield getattr(node, "lineno", 0), ast.unparse(node)


def test_the_scan_finds_a_clients_private_read_and_nothing_else() -> None:
    names = client_privates()
    assert {"_settings", "_flows", "_silence", "_open_entries"} <= names
    source = (
        "key = client._settings.api_key\n"
        "model = self.client._flows.durations\n"
        "silence = getattr(made, '_silence')\n"
        "seconds = client.gateway_silent_for\n"
        "backend = pool._network_backend\n"
        "self._settings = settings\n"
    )
    assert sorted(line for line, _ in private_reads(source, names)) == [1, 2, 3]


def test_nothing_outside_the_client_modules_reads_a_clients_private_attributes() -> None:
    names = client_privates()
    found = [
        f"{path.relative_to(SRC)}:{line}: {text}"
        for path in sorted(SRC.rglob("*.py"))
        if path not in CLIENT_MODULES
        for line, text in private_reads(path.read_text(encoding="utf-8"), names)
    ]
    assert found == [], "use the client's public accessors instead:\n" + "\n".join(found)
