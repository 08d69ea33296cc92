"""A griffe extension for the API reference: the SDK's docstrings are written for a terminal
and for Sphinx (``:class:`Client```, ``Example::`` then an indented block); mkdocstrings reads
Markdown. Roles become code spans and each ``::`` block a fenced Python block, so the
reference shows names as code and examples highlighted, without changing a docstring."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|meth|func|attr|exc|data|mod|obj|const):`(~?)([^`]+)`")
# A paragraph that ends in "::", a blank line, then lines indented deeper than it.
LITERAL = re.compile(
    r"(?m)^(?P<lead>[ \t]*)(?P<text>[^\n]*?)::[ \t]*\n\n(?P<body>(?:(?:(?P=lead)[ \t]+[^\n]*)?\n)+)"
)


def _role(match: re.Match[str]) -> str:
    kind, short, target = match.groups()
    name = target.rsplit(".", 1)[-1] if short else target
    return f"`{name}()`" if kind in ("meth", "func") else f"`{name}`"


def _literal(match: re.Match[str]) -> str:
    lead, text, body = match["lead"], match["text"], match["body"]
    code = textwrap.dedent(body).strip("\n")
    head = f"{lead}{text}:" if text.strip() else ""
    return f"{head}\n\n{lead}```python\n{textwrap.indent(code, lead)}\n{lead}```\n\n"


def markdown(text: str) -> str:
    """A Sphinx-flavoured docstring as Markdown (roles as code, ``::`` blocks fenced)."""
    return ROLE.sub(_role, LITERAL.sub(_literal, text + "\n")).rstrip("\n")


class RolesToMarkdown(griffe.Extension):
    """Rewrites every docstring as :func:`markdown` says, once its object is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """The package itself: griffe sends ``on_object`` for its members only."""
        self.on_object(obj=pkg)
