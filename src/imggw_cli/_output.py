"""Where output goes: data on stdout (plain lines, or one JSON object per result), everything
else on stderr (progress, notes, warnings, errors), so that ``--json`` output always parses.

A task's id, state, URLs, error and paths are chosen by whoever runs the gateway: every human
line passes the terminal sanitizer on its way out, so that none can carry an escape sequence
to the user's terminal. ``--json`` needs no such step: ``json.dumps`` escapes every control
character (and, with ``ensure_ascii``, every non-ASCII one).

Every line the command writes to stderr goes through :func:`say`: today's text, or, with
``--log-format json`` (env ``IMGGW_LOG_FORMAT=json``, DESIGN 17), one JSON object a line, so
that a batch running for days under systemd or Kubernetes leaves a log a machine can read.
A JSON line has ``time`` (ISO 8601 UTC), ``level``, ``event``, ``message`` (the text line as
the text form prints it) and the fields that apply (``task_id``, ``line``, ``counts``,
``spent``, ``exit_code``, ``logger``, ``traceback``...); a field with no value is left out.
Both forms pass every string through the terminal sanitizer and blank the API key. The format
is known before Click parses anything (:func:`start`, from argv and the environment), so that
a usage error is already in the chosen form; each command then confirms it from its own
options (:func:`begin`, :func:`use`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from imggw_client.text import printable, strict_json

from ._when import iso_utc, links_expire

if TYPE_CHECKING:
    from imggw_client import DownloadedFile, Submission, Task


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


def shown_urls(task: Task) -> list[str]:
    """The task's result links as they may be printed: a link in which the gateway put the API
    key itself has the key blanked (the command line reads the key from the environment only)."""
    from imggw_client.text import redact_url  # on first use it loads pydantic: not for --help

    secrets = (os.environ.get("IMGGW_API_KEY", ""),)
    return [redact_url(url, secrets) for url in task.image_urls]


def task_record(task: Task, files: list[DownloadedFile] | None = None) -> dict[str, Any]:
    """The ``--json`` fields of a task: the pinned ones (DESIGN 6), then money and expiry."""
    record: dict[str, Any] = {
        "task_id": task.id,
        "status": task.status.value,
        "progress": task.progress,
        "image_urls": shown_urls(task),
        "error": task.error.model_dump() if task.error else None,
        "cost": task.cost,
        "credits": task.credits,
        "expires_at": iso_utc(task.expires_at) if task.expires_at else None,
    }
    if files is not None:
        record["files"] = file_records(files)
    return record


def file_records(files: list[DownloadedFile]) -> list[dict[str, Any]]:
    """Saved files as every ``--json`` record lists them (DESIGN 6 and 7): ``path``,
    ``sha256``, ``size``."""
    return [{"path": str(f.path), "sha256": f.sha256, "size": f.size} for f in files]


def unfinished_record(task_id: str, last: Task | None) -> dict[str, Any]:
    """The ``--json`` record of a task still active when a wait ended: as last seen, or, when
    no query was answered, the pinned fields with status ``running`` (a wait that times out
    says nothing of failure)."""
    if last is not None:
        return task_record(last)
    return {
        "task_id": task_id,
        "status": "running",
        "progress": None,
        "image_urls": [],
        "error": None,
        "cost": None,
        "credits": None,
        "expires_at": None,
    }


def submission_record(sub: Submission) -> dict[str, Any]:
    return {"task_id": sub.task_id, "idempotency_key": sub.idempotency_key, "surface": sub.surface}


def task_lines(task: Task) -> list[str]:
    """A task for people, a fact a line."""
    lines = [f"task_id: {task.id}", f"status: {task.status.value}"]
    if task.progress is not None:
        lines.append(f"progress: {task.progress}%")
    lines += [f"image_url: {url}" for url in shown_urls(task)]
    if task.expires_at is not None:
        lines.append(links_expire(task.expires_at))
    if task.cost is not None:
        lines.append(f"cost: {task.cost:g}")
    if task.credits is not None:
        lines.append(f"credits: {task.credits:g}")
    if task.error:
        lines.append(f"error: {task.error.code}: {task.error.message}")
    return lines


def stdout(line: str) -> None:
    """One line of data on stdout, flushed. When its reader is gone (``imggw tasks | head -1``)
    the command ends there, quietly, with exit 0: what the reader wanted it has."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        closed_stdout()


def closed_stdout() -> NoReturn:
    """Ends a command whose stdout's reader is gone: exit 0, no traceback, and stdout pointed
    at the null device, so that Python's last flush at exit finds no closed pipe either.
    ``SystemExit`` passes every handler of a command's errors (they take ``Exception``)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout with no descriptor (tests)
        pass
    raise SystemExit(0)


class Shown(Protocol):
    """What output reads of the command's options (``_globals.Globals``, which reads this
    module's log format: named here by shape, so neither imports the other both ways)."""

    @property
    def json(self) -> bool: ...

    @property
    def quiet(self) -> bool: ...


class Output:
    def __init__(self, options: Shown) -> None:
        self.json = options.json
        self.quiet = options.quiet

    def data(self, record: dict[str, Any], lines: list[str]) -> None:
        """One result: its JSON object with --json, else its human lines."""
        if self.json:
            # Strict JSON: a sum of huge charges is null, never Infinity (parsers refuse it).
            stdout(strict_json(record))
        else:
            for line in lines:
                stdout(printable(line))

    def note(self, text: str, *, event: str = "note", **fields: Any) -> None:
        """Progress and hints: not with --quiet. ``event`` and ``fields`` are for
        --log-format json (:func:`say`)."""
        if not self.quiet:
            say(text, level="info", event=event, **fields)

    def warn(self, text: str, *, event: str = "warning", **fields: Any) -> None:
        """Something the user should act on: shown even with --quiet."""
        say(f"warning: {text}", level="warning", event=event, **fields)

    def error(self, text: str, *, event: str = "error", **fields: Any) -> None:
        say(f"error: {text}", level="error", event=event, **fields)

    @contextmanager
    def progress(self, task_id: str) -> Iterator[Callable[[Task], None]]:
        """An ``on_update`` callback drawing the task's state: a live bar on a terminal, a
        line per change otherwise (and always with --log-format json), nothing with --quiet."""
        started = time.monotonic()
        if self.quiet:
            yield lambda task: None
            return
        if is_json() or not sys.stderr.isatty():

            def line(task: Task) -> None:
                percent = "" if task.progress is None else f" {task.progress}%"
                elapsed = time.monotonic() - started
                self.note(
                    f"task {task_id}: {task.status.value}{percent} ({elapsed:.1f}s)",
                    event="progress",
                    task_id=task_id,
                    status=task.status.value,
                    progress=task.progress,
                    elapsed=round(elapsed, 1),
                    spent=spent(task.credits, task.cost),
                )

            yield line
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("task {task.fields[task_id]}", markup=False),
            TextColumn("{task.fields[state]:<9}", markup=False),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        row = bar.add_task("", total=100, task_id=printable(task_id, 40), state="submitted")

        def draw(task: Task) -> None:
            bar.update(row, completed=task.progress or 0, state=task.status.value)

        with bar:
            yield draw


def spent(credits: float | None, cost: float | None, **more: Any) -> dict[str, Any] | None:
    """The ``spent`` field of a JSON stderr line: what was charged, when anything is known."""
    if credits is None and cost is None:
        return None
    return {"credits": credits, "cost": cost, **more}
