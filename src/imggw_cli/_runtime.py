"""Turning options into a working client, and into logging."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import imggw_client

from . import _output
from ._globals import Globals
from ._output import safe

if TYPE_CHECKING:
    from imggw_client import AsyncClient, Client, Surface
    from imggw_client.tracking import Journal

# Every request the CLI makes names it; the SDK appends its own name after ours.
USER_AGENT = f"imggw-cli/{imggw_client.__version__}"

# --mock: tasks of a second or so, so that a demo ends in seconds, and images worth looking at.
MOCK_SETTINGS: dict[str, Any] = {"duration_min": 0.5, "duration_max": 1.5, "image_size": 512}


@contextmanager
def make_client(options: Globals, *, journal: bool = False) -> Iterator[Client]:
    """A client for the options, closed with its HTTP connections when the command ends: the
    in-process reference gateway with --mock, else the gateway at --base-url / IMGGW_BASE_URL
    with the key from IMGGW_API_KEY (the only place it is read). ``journal``: the command's
    tasks are recorded in the CLI's journal (see :func:`open_journal`)."""
    from imggw_client import Client

    settings, http_options = _target(options)
    opened = open_journal(options) if journal else False
    settings["journal"] = opened
    # Made as the client makes its own (a whole request, headers included, ends within its
    # timeout however slowly a gateway answers), with our User-Agent on it.
    try:
        with (
            Client.make_http_client(**http_options) as http,
            Client(http_client=http, **settings) as client,
        ):
            yield client
    finally:  # a journal given to a client is the giver's to close
        if not isinstance(opened, bool):
            opened.close()


@asynccontextmanager
async def make_async_client(
    options: Globals, *, journal: Journal | bool = False
) -> AsyncIterator[AsyncClient]:
    """The same as make_client, asynchronous (for batches, and ``tasks collect`` with the
    journal it opened)."""
    from imggw_client import AsyncClient

    settings, http_options = _target(options)
    if journal:
        settings["journal"] = journal
    async with (
        AsyncClient.make_http_client(**http_options) as http,
        AsyncClient(http_client=http, **settings) as client,
    ):
        yield client


def _target(options: Globals) -> tuple[dict[str, Any], dict[str, Any]]:
    """The client's settings and its httpx client's, for the options."""
    settings: dict[str, Any] = {
        "surface": options.chosen_surface,
        "rate_limit": options.rate_limit,
        "base_url": options.base_url,
        # A batch keeps its own ledger; only the task commands journal (and IMGGW_JOURNAL is
        # read by open_journal, not by the client).
        "journal": False,
    }
    http: dict[str, Any] = {"headers": {"User-Agent": USER_AGENT}}
    if options.mock:
        from imggw_client import PollPolicy
        from imggw_client.mock import IN_PROCESS_URL, MockGateway

        # Each --mock run is a fresh gateway: ids that differ between runs keep one run's
        # files from colliding with the last one's.
        first = time.time_ns() // 1_000_000 % 10**12
        gateway = MockGateway(first_task_id=first, **MOCK_SETTINGS)
        settings.update(
            api_key=gateway.config.api_keys[0],
            base_url=IN_PROCESS_URL,
            poll=PollPolicy(initial_interval=0.2, max_interval=0.5),
        )
        http["transport"] = gateway.transport()
    return settings, http


class _Redact(logging.Filter):
    """Blanks the API key in any log line, whatever logged it."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secret and self.secret in record.getMessage():
            record.msg = record.getMessage().replace(self.secret, "[redacted]")
            record.args = ()
        return True


class _Printable(logging.Formatter):
    """Log lines quote what a gateway sent (an unknown task state, an error reason): each line
    passes the terminal sanitizer, so none can carry an escape sequence to the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return safe(super().format(record))


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is when a line is logged, so that a handler left from an
    earlier command in the same process (tests, embedding) never writes to a closed stream.
    With --log-format json a record is one JSON object: its message, its logger, and its
    traceback (if any) inside a string, never as lines of their own."""

    imggw_cli = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not _output.is_json():
                print(self.format(record), file=sys.stderr, flush=True)
                return
            trace = None
            if record.exc_info:
                trace = logging.Formatter().formatException(record.exc_info)
            # task_id and line, when a logger passes them (``extra=``), as fields of their own
            _output.say(
                record.getMessage(),
                level=record.levelname.lower(),
                event="log",
                logger=record.name,
                task_id=getattr(record, "task_id", None),
                line=getattr(record, "line", None),
                traceback=trace,
            )
        except Exception:
            self.handleError(record)


# httpx2 logs under its own name: an application that aliases httpx to it gets its lines too.
_LOGGERS = ("imggw_client", "httpx", "httpx2")
_WARNINGS = "py.warnings"  # the logger name Python's logging gives its warnings


def setup_logging(options: Globals) -> None:
    """Warnings from the SDK on stderr, sanitized; with --verbose, debug logs too, the key
    blanked. Idempotent, so that running several commands in one process (tests, embedding)
    never stacks handlers."""
    # IMGGW_LOG=debug|info asks the SDK for its records on stderr: here the command writes
    # them itself (sanitized, in the chosen log format), at that level, never twice.
    asked = os.environ.get("IMGGW_LOG", "").strip().lower()
    level = (
        logging.DEBUG
        if options.verbose or asked == "debug"
        else (logging.INFO if asked == "info" else logging.WARNING)
    )
    handler = _Stderr(level)
    if level < logging.WARNING:
        handler.setFormatter(_Printable("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_Printable("warning: %(message)s"))
    key = os.environ.get("IMGGW_API_KEY", "")
    if len(key) >= 4:
        handler.addFilter(_Redact(key))
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        for old in [
            h
            for h in logger.handlers
            if getattr(h, "imggw_cli", False) or type(h).__name__ == "StderrHandler"
        ]:
            logger.removeHandler(old)
        # Without --verbose (or IMGGW_LOG) the level is left to the root logger (WARNING
        # unless the host program says otherwise).
        logger.setLevel(level if level < logging.WARNING else logging.NOTSET)
        logger.addHandler(handler)
    _take_warnings(_output.is_json())


_shown: list[Any] = []  # Python's own showwarning, while ours stands in for it


def _take_warnings(take: bool) -> None:
    """Python's warnings (a library's DeprecationWarning, say) are stderr lines too: with
    --log-format json each is a JSON object; else they are left to Python, as they were."""
    import warnings

    if take and warnings.showwarning is not _show_warning:
        _shown[:] = [warnings.showwarning]
        warnings.showwarning = _show_warning
    elif not take and warnings.showwarning is _show_warning and _shown:
        warnings.showwarning = _shown.pop()


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    if file is not None or not _output.is_json():  # not stderr's, or no longer ours to write
        if _shown:
            _shown[0](message, category, filename, lineno, file, line)
        return
    _output.say(
        f"{category.__name__}: {message}",
        level="warning",
        event="log",
        logger=_WARNINGS,
        source=f"{filename}:{lineno}",
    )


def adopt(name: str) -> None:
    """The logger ``name`` (a library that sets up its own stderr handlers, as Dask's
    distributed does) written through ours, with --log-format json."""
    if not _output.is_json():
        return
    logger = logging.getLogger(name)
    ours = logging.getLogger(_LOGGERS[0]).handlers
    handler = next((h for h in ours if getattr(h, "imggw_cli", False)), None)
    if handler is None:
        return
    for old in list(logger.handlers):
        stream = getattr(old, "stream", None)
        if stream in (sys.stderr, sys.__stderr__) or getattr(old, "imggw_cli", False):
            logger.removeHandler(old)
    logger.addHandler(handler)


JOURNAL_ENV = "IMGGW_JOURNAL"
JOURNAL_UNSAFE = "journal_unsafe"  # the SDK's code for a journal others could write


def journal_path() -> Path | None:
    """Where the CLI keeps its journal: ``$IMGGW_JOURNAL``, else
    ``$XDG_STATE_HOME/imggw/journal.sqlite``, else ``~/.local/state/imggw/journal.sqlite``;
    None when ``IMGGW_JOURNAL`` is ``off`` (or empty). A relative ``XDG_STATE_HOME`` is
    ignored, as the XDG spec says: it would name another folder in every working directory.
    The path is absolute, so that every message names the same file."""
    named = os.environ.get(JOURNAL_ENV)
    if named is not None:
        if named.strip().lower() in ("", "off"):
            return None
        return Path(os.path.abspath(os.path.expanduser(named)))
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(os.path.abspath(state)) / "imggw" / "journal.sqlite"


def open_journal(options: Globals) -> Journal | bool:
    """The journal a task command records in (False for none): none with --no-journal or
    --mock (its tasks end with the process). One the user named (IMGGW_JOURNAL) that cannot be
    opened, and any that others could write (``journal_unsafe``: planted rows would be paid
    for), raise ConfigurationError (exit 4, before anything is sent); a default one that cannot
    be opened is a warning and the command goes on without it."""
    path = journal_path()
    if options.no_journal or options.mock or path is None:
        return False
    from imggw_client import ConfigurationError
    from imggw_client.tracking import Journal

    try:
        return Journal(path)
    except ConfigurationError as err:
        if os.environ.get(JOURNAL_ENV) is not None or err.code == JOURNAL_UNSAFE:
            raise
        text = f"warning: {safe(err.message)}; going on without a journal of this task"
        _output.say(
            text + " (--no-journal silences this)", level="warning", event="journal_unusable"
        )
        return False


def file_prefix(surface: str, options: Globals) -> str:
    """How a task's result files start, the one rule of every command (a batch's too): nothing
    for a task on the command's surface (``<task id>-<n>.<ext>``, as ``Client.download``
    names them); ``<surface>-`` for one of the other surface, whose ids may be the same."""
    return "" if surface == options.chosen_surface else f"{surface}-"


LOOKED_THROUGH = 1000  # the newest rows a task's surface is looked for in (journaled_surfaces)


def journaled_surfaces(
    client: Client, options: Globals, task_ids: Sequence[str]
) -> dict[str, Surface]:
    """The surface to ask each of ``task_ids`` on when none was chosen (--surface,
    IMGGW_SURFACE): the one the client's journal (its gateway and key) recorded it on, for an id
    it holds on one surface alone. Unfinished tasks are looked through first: they are few,
    and the ones asked about; then the newest :data:`LOOKED_THROUGH` (a journal may hold a
    hundred thousand rows: a task older than those is asked on the options' surface). Empty
    when a surface was chosen or no journal is kept."""
    journal = client.journal
    if options.surface is not None or journal is None:
        return {}
    found: dict[str, Surface] = {}
    for unfinished, limit in ((True, None), (False, LOOKED_THROUGH)):
        left = set(task_ids) - set(found)
        if not left:
            break
        seen: dict[str, set[str]] = {}
        mine = journal.tasks(unfinished=unfinished, scope=client.journal_scope, limit=limit)
        for entry in mine:
            if entry.task_id in left:
                seen.setdefault(entry.task_id, set()).add(entry.surface)
        # A journal row's surface is one of the spec's (a row with another is damaged, skipped).
        found.update(
            (task_id, cast("Surface", on.pop())) for task_id, on in seen.items() if len(on) == 1
        )
    return found
