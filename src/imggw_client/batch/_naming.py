"""What a batch's result files are called: ``name=`` (``imggw batch --name``), a template of
``{task_id}``, ``{index}``, ``{line}`` and ``{id}``, rendered into a name safe on any
filesystem, and every line's names checked for collisions before anything is sent.

A template holds plain fields only: a format spec or a conversion (``{line:05}``,
``{id:/^9}``, ``{id!r}``) is refused, since its fill characters would reach the name unchecked
(``/`` makes a path, ESC a control character). A line's ``id`` is written by whoever wrote the
input: it is hostile text. Each field's value keeps letters, digits, ``-``, ``_`` and ``.``
(others become ``_``); a name never starts with a dot, never ends with a dot or a space, is
never a reserved Windows device name (``CON``, ``NUL``, ``COM1``...), and is at most
:data:`MAX_STEM_BYTES` bytes of UTF-8 (cut at a character, and given a hash of the whole, so
two long ids still get two names): with a surface prefix and the extension, at most
:data:`MAX_NAME_BYTES`, what filesystems allow. The extension still comes from the content,
as ``download`` decides it.
"""

from __future__ import annotations

import hashlib
import re
import string
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from .._core.exceptions import RequestValidationError
from .._core.text import printable
from ._lines import BadLine, BatchInputError
from ._schema import BAD, Row

__all__ = ["DEFAULT_NAME", "INCOMING_DIR", "MAX_NAME_BYTES", "MAX_STEM_BYTES", "NameTemplate"]

DEFAULT_NAME = "{task_id}-{index}"  # the names results always had: folders resume unchanged
FIELDS = ("task_id", "index", "line", "id")
UNIQUE_FIELDS = ("task_id", "line", "id")  # one of them tells every line's files apart
# Results named by a template land here first, under their task's name, then are renamed into
# place: a name an input's author chose is never where another line's download lands.
INCOMING_DIR = ".incoming"
MAX_NAME_BYTES = 255  # a file name's limit on Linux, macOS and Windows filesystems
# Room for a surface prefix ("alpha-") and an extension (".webp") within MAX_NAME_BYTES.
MAX_STEM_BYTES = MAX_NAME_BYTES - 15
_UNSAFE = re.compile(r"[^\w.-]")  # \w is Unicode letters and digits, and "_"
_DOTS = re.compile(r"\.{2,}")  # never "..", whatever a filesystem makes of it
_LITERAL = re.compile(r"[\w.-]*")
_RESERVED = frozenset(
    ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"]
    + [f"{dev}{n}" for dev in ("COM", "LPT") for n in (*"123456789", "¹", "²", "³")]
)


def _invalid(why: str) -> RequestValidationError:
    return RequestValidationError("name", why, code="invalid_option")


_KNOWN = ", ".join("{" + f + "}" for f in FIELDS)


def _written(field_name: str, conversion: str | None, spec: str | None) -> str:
    """A replacement field as the template wrote it."""
    shown = "{" + field_name
    if conversion:
        shown += "!" + conversion
    if spec:
        shown += ":" + spec
    return shown + "}"


def safe_part(value: str) -> str:
    """A field's value as it may stand in a file name: NFC, and anything but letters, digits,
    ``-``, ``_`` and ``.`` replaced by ``_`` (separators, control characters, NUL, spaces)."""
    return _UNSAFE.sub("_", unicodedata.normalize("NFC", value))


def safe_stem(stem: str) -> str:
    """A rendered name made safe as a whole: no leading dot (hidden, or ``..``), no trailing
    dot or space (Windows drops them), never a device name, at most :data:`MAX_STEM_BYTES`
    bytes of UTF-8 (cut at a character, with a hash of the whole, so distinct names stay
    distinct)."""
    stem = _DOTS.sub(".", stem).lstrip(".").rstrip(". ")
    encoded = stem.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_STEM_BYTES:
        digest = hashlib.sha256(encoded).hexdigest()[:12]
        # A cut inside a character's bytes drops that character: the rest stays valid UTF-8.
        kept = encoded[: MAX_STEM_BYTES - 13].decode("utf-8", "ignore")
        stem = f"{kept.rstrip('. ')}-{digest}"
    if not stem:
        return "_"
    if stem.split(".")[0].upper() in _RESERVED:
        return f"_{stem}"
    return stem


@dataclass(frozen=True)
class NameTemplate:
    """A checked ``name=`` template.

    Without ``{index}``, a task's first result is named by the template alone and its others
    get ``-1``, ``-2``... after it.
    """

    text: str
    fields: frozenset[str]

    @classmethod
    def parse(cls, text: object) -> NameTemplate:
        """The template, or :class:`RequestValidationError` (a field it does not know, a
        format spec or conversion, a path, a template that cannot tell lines apart).
        """
        if not isinstance(text, str) or not text:
            raise _invalid(f"must be a template such as {DEFAULT_NAME!r}")
        used: set[str] = set()
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as err:
            raise _invalid(f"is not a template ({err})") from err
        for literal, field_name, spec, conversion in parsed:
            if not _LITERAL.fullmatch(literal):
                raise _invalid(
                    "is a file name, not a path: outside its fields it may hold only letters, "
                    "digits, '-', '_' and '.'"
                )
            if field_name is None:
                continue
            if field_name not in FIELDS or conversion or spec:
                written = printable(_written(field_name, conversion, spec), 40)
                raise _invalid(
                    f"may use only the plain fields {_KNOWN}, with no format spec or "
                    f"conversion (got {written})"
                )
            used.add(field_name)
        if not used & set(UNIQUE_FIELDS):
            raise _invalid(
                "must hold {task_id}, {line} or {id}: otherwise every line's file has the same name"
            )
        return cls(text, frozenset(used))

    @property
    def is_default(self) -> bool:
        return self.text == DEFAULT_NAME

    def render_fields(self, *, task_id: str, index: int, line: int, caller_id: str) -> str:
        """The stem for these values, made safe (see :func:`safe_stem`)."""
        stem = self.text.format(
            task_id=safe_part(task_id), index=index, line=line, id=safe_part(caller_id)
        )
        if "index" not in self.fields and index:
            stem = f"{stem}-{index}"
        return safe_stem(stem)

    def render(self, row: Row, index: int) -> str:
        """The stem of result ``index`` of the row's task (``{task_id}`` needs its task)."""
        return self.render_fields(
            task_id=row.task_id or "", index=index, line=row.line, caller_id=row.caller_id or ""
        )

    def check(self, rows: Iterable[Row]) -> None:
        """Refuses (:class:`BatchInputError`, nothing sent) lines whose first result would share
        a file with another line's (case folded: macOS and Windows tell no case apart), and
        lines with no ``id`` when the template uses ``{id}``. A template with ``{task_id}``
        cannot collide: task ids are the gateway's, one per task (a task of another surface
        gets that surface's prefix, as the default names do)."""
        bad: list[BadLine] = []
        seen: dict[str, int] = {}
        for row in rows:
            if row.kind == BAD:
                continue
            if "id" in self.fields and row.caller_id is None:
                bad.append(BadLine(row.line, "has no id, and the name template uses {id}"))
                continue
            if "task_id" in self.fields:
                continue
            stem = self.render(row, 0)
            folded = stem.casefold()
            if folded in seen:
                bad.append(BadLine(row.line, f"its file {stem!r} is line {seen[folded]}'s too"))
            else:
                seen[folded] = row.line
        if bad:
            raise BatchInputError(
                bad[:1000],
                len(bad),
                message=_collisions(bad, self.text) + "; nothing was sent",
            )


def _collisions(bad: list[BadLine], text: str) -> str:
    shown = "; ".join(f"line {b.line} {b.reason}" for b in bad[:10])
    more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
    return f"--name {text!r} gives {len(bad)} line(s) no file of their own: {shown}{more}"
