"""A batch in one process into one local folder: :func:`arun_batch` and :func:`run_batch`, a
thin driver over the tracker's loop (``_execute``) whose folder is its own result store."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._async_client import AsyncClient
from .._core.config import RateLimit, check_surface
from .._core.exceptions import RequestValidationError
from .._files import refuse_links
from . import _identity
from ._execute import execute
from ._gallery import GALLERY_DIR, GALLERY_NAME
from ._ledger import LOCK_NAME, Ledger, remove_if_empty
from ._lines import BAD_LINES_NAME, BatchInputError
from ._manifest import MANIFEST_NAME
from ._naming import INCOMING_DIR
from ._options import BatchOptions
from ._plan import FolderIdentity
from ._reports import BatchProgress, BatchReport
from ._schema import LEDGER_NAME
from ._store import LocalStore, Workspace
from .scale._storage import destination_name

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._options import RunOptions

__all__ = [
    "arun_batch",
    "client_maker",
    "run_batch",
    "run_blocking",
    "run_id_for",
    "run_in_folder",
]

# The files a run writes into its folder: a symbolic link planted at any of them stops the run
# before it plans (imggw writes through none: see _storage.atomic_write).
FOLDER_FILES = (
    LEDGER_NAME,
    f"{LEDGER_NAME}-wal",
    f"{LEDGER_NAME}-shm",
    LOCK_NAME,
    MANIFEST_NAME,
    _identity.RUN_NAME,
    _identity.LINES_NAME,
    GALLERY_NAME,
    GALLERY_DIR,
    BAD_LINES_NAME,
    INCOMING_DIR,
)


def run_id_for(dest: str | Path, client: AsyncClient) -> str:
    """The run id a new run on ``dest`` gets with ``client``: the same for the same folder,
    gateway and API key, on any machine (the key's slow fingerprint makes it: blocking, a few
    tens of milliseconds the first time a client is asked).
    """
    place = destination_name(dest)
    return _identity.derive_run_id(place, client.base_url, client.key_fingerprint)


async def arun_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """Runs (or resumes) a batch: every line submitted once, waited on, downloaded, verified.

    ``source`` is a JSONL or text file (``-``: standard input), or an iterable of requests
    (``ImageRequest``, dicts with the JSONL fields, or prompts); ``options`` are those of
    :class:`BatchOptions` (``concurrency``, ``timeout``, ``line_timeout``, ``surface``,
    ``skip_bad_lines``, ``allow_changes``, ``wait``, ``verify``, ``gallery``, ``format``,
    ``new_run``, and the guards ``max_credits``, ``max_cost``, ``max_failures``). A line with
    ``task_id`` names a task made elsewhere: it is collected (waited on and downloaded), never
    submitted (a whole list of tasks: :func:`collect_tasks`). Bad lines stop the run before
    anything is sent (:class:`BatchInputError`) unless ``skip_bad_lines``; so does an input that
    changed since the folder's run began, or a surface other than its run's
    (:class:`InputChangedError`), unless ``allow_changes``. What ``timeout`` leaves unfinished,
    and a task still running after ``line_timeout`` (default 1800 s), is resumed by the next
    run with the same ``out_dir``.
    A run never submits a line whose result the folder has no room for: short of room it
    finishes what it sent, then raises :class:`StorageError` (the CLI's exit 4).

    The first run on a folder keeps its run id there; every line's key follows from it. That
    id is derived from the folder, the client's gateway and API key (never kept), so a run on
    a folder deleted and made again sends the same keys, and the gateway replays the tasks it
    still remembers instead of billing them again. ``new_run=True`` makes a random id instead
    (new keys, new tasks), in a folder that holds no run.

    Example::

        async with AsyncClient() as client:
            report = await arun_batch("prompts.jsonl", "out/", client=client, concurrency=16)
    """
    chosen = BatchOptions.of(options)
    return await run_in_folder(
        source, out_dir, client=client, options=chosen, on_progress=on_progress
    )


async def run_in_folder(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    options: BatchOptions,
    on_progress: Callable[[BatchProgress], None] | None = None,
    tasks: bool = False,
) -> BatchReport:
    """A run in one local folder, its own result store: the folder's ledger (locked) and
    identity, then :func:`execute` (``tasks``: the input lists tasks made elsewhere). A run
    refused before anything was kept leaves no empty folder behind.
    """
    folder = Path(out_dir)
    made = not folder.exists()
    surface = check_surface(options.surface or client.surface)
    named = isinstance(source, (str, Path)) and str(source) != "-"
    title = f"imggw batch: {Path(str(source)).name}" if named else "imggw batch"

    def identity() -> FolderIdentity:
        derive = lambda: run_id_for(folder, client)  # noqa: E731 - called once, if at all
        # The run's template and input, for a rerun and its resume hint (`batch status`).
        source_path = os.path.abspath(str(source)) if named else None
        return FolderIdentity(
            folder,
            surface=surface,
            derive=derive,
            new_run=options.new_run,
            key_fingerprint=client.key_fingerprint,
            name=options.name,
            input_path=source_path,
        )

    try:
        refuse_links(folder, FOLDER_FILES)  # before anything is planned or paid for
        with Ledger.open(folder) as ledger:
            try:
                kept = await anyio.to_thread.run_sync(identity)
            except BaseException:
                ledger.discard()
                raise
            work = Workspace(
                folder, ledger, kept, LocalStore(folder), gallery=title if options.gallery else None
            )
            return await execute(
                source, work, client=client, options=options, on_progress=on_progress, tasks=tasks
            )
    except (
        BatchInputError,
        _identity.InputChangedError,
        RequestValidationError,
        _identity.KeyChangedError,
    ):
        if made:  # refused before anything was kept: no empty folder left behind either
            remove_if_empty(folder)
        raise


def client_maker(
    client_factory: Callable[[], AsyncClient] | None, rate_limit: RateLimit | None
) -> Callable[[], AsyncClient]:
    """What the blocking entry points make their client with: the caller's factory, or an
    ``AsyncClient`` from the environment with ``rate_limit`` (not both)."""
    if client_factory is not None and rate_limit is not None:
        raise RequestValidationError(
            "rate_limit", "give it to the client your client_factory makes", code="invalid_option"
        )
    if client_factory is not None:
        return client_factory
    return lambda: AsyncClient(rate_limit=rate_limit)


def run_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None = None,
    rate_limit: RateLimit | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """The blocking form of :func:`arun_batch`. ``client_factory`` makes the AsyncClient to use
    (default: ``AsyncClient(rate_limit=rate_limit)`` from ``IMGGW_API_KEY`` /
    ``IMGGW_BASE_URL``); ``rate_limit`` is the request budget of that default client (give
    your factory's client its own).

    Example::

        report = run_batch("prompts.jsonl", "out/", concurrency=16, timeout=3600)
        sys.exit(report.exit_code)
    """
    return run_blocking(
        source,
        out_dir,
        client_factory=client_factory,
        rate_limit=rate_limit,
        on_progress=on_progress,
        options=options,
    )


def run_blocking(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None,
    rate_limit: RateLimit | None,
    on_progress: Callable[[BatchProgress], None] | None,
    options: RunOptions,
    tasks: bool = False,
) -> BatchReport:
    """:func:`run_in_folder` to its end in this thread, with a client made for it (see
    :func:`client_maker`): the blocking entry points (``run_batch``, ``collect_tasks``).
    """
    make = client_maker(client_factory, rate_limit)
    chosen = BatchOptions.of(options)  # a bad option is refused before a client is made

    async def main() -> BatchReport:
        async with make() as client:
            return await run_in_folder(
                source, out_dir, client=client, options=chosen, on_progress=on_progress, tasks=tasks
            )

    return anyio.run(main)
