"""``imggw download``: the results of tasks given by id, or collected from a list (``--from``,
a batch run that keeps a ledger and resumes)."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import _exit
from ._batch_run import ProgressEvery, progress_every, run_local
from ._command import (
    Concurrency,
    OutputDir,
    Overwrite,
    RunTimeout,
    SkipBadLines,
    Tracked,
    refuse,
    session,
)
from ._globals import current, with_globals
from ._output import task_record
from ._runtime import file_prefix, journaled_surfaces, make_client

app = typer.Typer()


@app.command(epilog=_exit.EPILOG)
@with_globals
def download(
    task_ids: Annotated[
        Optional[list[str]],  # noqa: UP045 - Typer wants this spelling on Python 3.10
        typer.Argument(help="Task ids (or --from FILE for many).", show_default=False),
    ] = None,
    output: OutputDir = Path("."),
    overwrite: Overwrite = False,
    source: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--from",
            metavar="FILE",
            help="Collect the tasks FILE lists (- reads standard input): bare ids or JSON lines "
            "with task_id (and surface), as submit --json and a batch manifest print them. "
            "Keeps a ledger and manifest.jsonl in --output; rerun to resume (the list may "
            "grow or shrink between runs: collecting bills nothing).",
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for unfinished tasks (default: report them).")
    ] = False,
    timeout: RunTimeout = None,
    concurrency: Concurrency = 8,
    skip_bad_lines: SkipBadLines = False,
    every: ProgressEvery = None,
) -> None:
    """Download the results of finished tasks; print the saved paths.

    Without --wait, unfinished tasks are reported (exit 3) and the rest saved; an id the key
    cannot see exits 1, beside unfinished ones too (no later run mends it). With --from,
    results are saved the soonest-expiring first, a dead link is asked again for a fresh one,
    and the run resumes where it stopped (exit codes as imggw batch).

    Example: imggw download 123 124 -o out/ --wait; imggw download --from ids.txt -o out/
    """
    if (source is None) == (not task_ids):
        refuse("give task ids, or --from FILE (one of them)")
    if source is not None:  # the journal learns what it saves, where (DESIGN 22)
        run_local(
            source,
            output.absolute(),
            tasks=True,
            wait=wait,
            timeout=timeout,
            concurrency=concurrency,
            skip_bad_lines=skip_bad_lines,
            every=progress_every(every),
        )
        return
    assert task_ids is not None
    _download_ids(task_ids, output, overwrite=overwrite, wait=wait, timeout=timeout)


def _download_ids(
    task_ids: list[str],
    output: Path,
    *,
    overwrite: bool,
    wait: bool,
    timeout: Optional[float],  # noqa: UP045
) -> None:
    from imggw_client import TaskFailedError, TaskStatus, WaitTimeoutError
    from imggw_client.text import printable

    met: list[_exit.Condition] = []
    with session(), make_client(current(), journal=True) as client:
        surfaces = journaled_surfaces(client, current(), task_ids)
        for task_id in task_ids:
            condition = _exit.Condition.OK
            tracked = Tracked(task_id, "download", output)
            tracked.surface = surfaces.get(task_id)
            try:
                with session(tracked) as out:
                    if wait:
                        with out.progress(task_id) as on_update:
                            try:
                                task = client.wait(
                                    task_id,
                                    surface=tracked.surface,
                                    wait_timeout=600.0 if timeout is None else timeout,
                                    on_update=on_update,
                                )
                            except TaskFailedError as failed:  # reported below, like the rest
                                task = failed.task
                    else:
                        task = client.get(task_id, surface=tracked.surface)
                    if not task.is_terminal:
                        raise WaitTimeoutError(task_id, task, timeout=0)
                    if task.status is TaskStatus.SUCCEEDED:
                        prefix = file_prefix(task.surface, current())
                        files = client.download(
                            task, output.absolute(), overwrite=overwrite, prefix=prefix
                        )
                    else:
                        files = []
                        reason = printable(task.error.message) if task.error else ""
                        out.error(
                            f"task {task_id} failed: {reason}", event="task_failed", task_id=task_id
                        )
                        condition = _exit.Condition.FAILED
                    out.data(task_record(task, files), [str(f.path) for f in files])
            except typer.Exit as failed:
                if _exit.is_interrupted(failed.exit_code):
                    raise
                condition = tracked.condition or _exit.condition_of_code(failed.exit_code)
            met.append(condition)
    code = _exit.several(met)
    if code:
        raise typer.Exit(code)
