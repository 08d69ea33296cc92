"""Reading JSON that may come from anyone: the one ``loads`` every part of the project uses.

``json.loads`` can raise ``RecursionError`` on deeply nested input (``[[[[...]]]]``), which is
not a ``ValueError`` and slips past every ``except ValueError``; it also keeps the last of
duplicate object keys silently. Here both become a ``ValueError``: what a proxy checked and
what a server acts on can never differ, and garbage is always just garbage.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads"]


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey("duplicate object key")
        result[key] = value
    return result


def loads(data: str | bytes | bytearray, *, unique_keys: bool = False) -> Any:
    """Parses JSON; raises ``ValueError`` for anything that is not sound JSON: bad syntax,
    bad encoding, nesting too deep to parse, or (with ``unique_keys``) a repeated key.

    Example::

        loads(b'{"a": 1}')                          # {'a': 1}
        loads("[" * 100_000)                        # ValueError, never RecursionError
        loads('{"a": 1, "a": 2}', unique_keys=True) # ValueError
    """
    try:
        return json.loads(data, object_pairs_hook=_unique if unique_keys else None)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
