"""Tasks made elsewhere, saved into one folder (DESIGN 12, "Collect tasks submitted anywhere"):
:func:`acollect_tasks` and :func:`collect_tasks`, the tracker fed with a list of task ids
(``imggw download --from``). A driver of its own over the same run as a batch (``_single``):
the input is read as a list of tasks (each line a bare id or a JSON object with ``task_id`` and
an optional ``surface``), every task waited on (or asked once) and saved, none submitted; the
folder keeps a ledger and ``manifest.jsonl`` (``line``: the line of the list), so a rerun
resumes and saves nothing twice. The list may grow or shrink between runs: collecting bills
nothing, so no change is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._async_client import AsyncClient
from .._core.config import RateLimit
from ._options import BatchOptions
from ._reports import BatchProgress, BatchReport
from ._single import run_blocking, run_in_folder

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._options import RunOptions

__all__ = ["acollect_tasks", "collect_tasks"]


async def acollect_tasks(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """Saves the results of the tasks ``source`` lists into ``out_dir``, the soonest-expiring
    first, a dead link asked for again; a rerun resumes. ``source`` is a file (``-``: standard
    input) or an iterable of task ids and dicts with ``task_id`` (and ``surface``). With
    ``wait=False`` each unfinished task is asked about once and reported (exit code 3), the
    rest saved. A bad line stops the run before anything is sent (:class:`BatchInputError`)
    unless ``skip_bad_lines``; a task the gateway does not know fails its own line only.
    ``options`` are those of :func:`run_batch` (its guards see nothing here: collecting bills
    nothing).

    Example::

        async with AsyncClient() as client:
            report = await acollect_tasks("ids.txt", "out/", client=client, concurrency=16)
    """
    chosen = BatchOptions.of(options)
    return await run_in_folder(
        source, out_dir, client=client, options=chosen, on_progress=on_progress, tasks=True
    )


def collect_tasks(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None = None,
    rate_limit: RateLimit | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """The blocking form of :func:`acollect_tasks` (``client_factory`` and ``rate_limit`` as
    in :func:`run_batch`).

    Example::

        report = collect_tasks(["123", {"task_id": "77", "surface": "alpha"}], "out/")
        sys.exit(report.exit_code)
    """
    return run_blocking(
        source,
        out_dir,
        client_factory=client_factory,
        rate_limit=rate_limit,
        on_progress=on_progress,
        options=options,
        tasks=True,
    )
