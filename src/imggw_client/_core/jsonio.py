"""Reading JSON that may come from anyone: the one ``loads`` every part of the project uses;
and :func:`dumps`, strict JSON out (never ``NaN`` or ``Infinity``, which strict parsers refuse).

``json.loads`` can raise ``RecursionError`` on deeply nested input (``[[[[...]]]]``), which is
not a ``ValueError`` and slips past every ``except ValueError``; it also keeps the last of
duplicate object keys silently. Here both become a ``ValueError``: what a proxy checked and
what a server acts on can never differ, and garbage is always just garbage.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite", "loads"]


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
    """
    try:
        return json.loads(data, object_pairs_hook=_unique if unique_keys else None)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite (a charge of 1e308 summed twice is
    ``inf``) made ``None``, through dicts, lists and tuples.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value: Any) -> str:
    """Strict JSON text: what no number can be (``NaN``, ``Infinity``) is ``null``, and
    anything that slipped past that raises instead of printing what parsers refuse.

    Example::

        from imggw_client.text import strict_json

        assert strict_json({"credits": 1e308 * 10}) == '{"credits": null}'
    """
    return json.dumps(finite(value), allow_nan=False)
