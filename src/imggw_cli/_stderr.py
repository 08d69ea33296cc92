"""Every line the command writes to stderr goes through :func:`say`: today's text, or, with
``--log-format json`` (env ``IMGGW_LOG_FORMAT=json``, DESIGN 17), one JSON object a line, so
that a batch running for days under systemd or Kubernetes leaves a log a machine can read.

A JSON line has ``time`` (ISO 8601 UTC), ``level``, ``event``, ``message`` (the text line as
the text form prints it) and the fields that apply (``task_id``, ``line``, ``counts``,
``spent``, ``exit_code``, ``logger``, ``traceback``...); a field with no value is left out.
Both forms pass every string through the terminal sanitizer and blank the API key.

The format is known before Click parses anything (:func:`start`, from argv and the
environment), so that a usage error is already in the chosen form; each command then confirms
it from its own options (:func:`begin`, :func:`use`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from imggw_client.text import printable, strict_json

TEXT, JSON = "text", "json"
ENV = "IMGGW_LOG_FORMAT"
FLAG = "--log-format"

_format = TEXT
# What the process was started with (argv and environment), once run() has read it: a command
# run in-process (tests, embedding) has none, and goes by the environment alone.
_early: str | None = None


def parse(value: str | None) -> str | None:
    """``text`` or ``json`` (any case), else None."""
    if value is None:
        return None
    chosen = value.strip().lower()
    return chosen if chosen in (TEXT, JSON) else None


def from_environment() -> str | None:
    return parse(os.environ.get(ENV) or None)


def from_argv(argv: Sequence[str]) -> str | None:
    """The last valid ``--log-format`` value on the command line (the last typed wins, as for
    every global option), up to ``--``. A value that is not text or json is not taken: the
    option's own check reports it, in the format the rest of the command line (or the
    environment) chose."""
    found: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        value = None
        if arg == FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(FLAG + "="):
            value = arg.partition("=")[2]
        found = parse(value) or found
    return found


def start(argv: Sequence[str]) -> None:
    """At process start, before Click parses: the format the command line or the environment
    asks for."""
    global _early
    _early = from_argv(argv) or from_environment() or TEXT
    use(_early)


def begin() -> None:
    """A command starts: the format the process started with, else the environment's (never
    one left over from an earlier command in the same process)."""
    use(_early or from_environment() or TEXT)


def use(chosen: str) -> None:
    global _format
    _format = chosen


def is_json() -> bool:
    return _format == JSON


def safe(text: str) -> str:
    """``text`` fit for a terminal: the line breaks we write kept, every other control escaped."""
    return "\n".join(printable(line) for line in text.split("\n"))


def _secrets() -> list[str]:
    key = os.environ.get("IMGGW_API_KEY", "")
    return [key] if len(key) >= 4 else []


def clean(value: Any, secrets: Sequence[str] | None = None) -> Any:
    """``value`` with every string in it (dict values and list items too) sanitized and the
    API key blanked; anything else that is not a number is written as its text."""
    secrets = _secrets() if secrets is None else secrets
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, "[redacted]")
        return safe(value)
    if isinstance(value, dict):
        return {str(k): clean(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v, secrets) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN nor infinity
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clean(str(value), secrets)  # a path, a moment, an enum: as text


def now_iso() -> str:
    """``2026-11-24T08:00:00.123Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(text: str, *, level: str, event: str, **fields: Any) -> dict[str, Any]:
    """The JSON object of one stderr line."""
    head: dict[str, Any] = {"time": now_iso(), "level": level, "event": event, "message": text}
    head.update((name, value) for name, value in fields.items() if value is not None)
    cleaned: dict[str, Any] = clean(head)
    return cleaned


def say(text: str, *, level: str = "info", event: str = "note", **fields: Any) -> None:
    """One message on stderr: ``text`` as it is, or its JSON object with ``fields``."""
    if is_json():
        line = strict_json(record(text, level=level, event=event, **fields))  # no Infinity
    else:
        line = clean(text)
    # One write for the line and its newline: a Ctrl-C between two writes would leave the next
    # message glued to this one.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
