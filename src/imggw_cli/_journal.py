"""``imggw tasks``: the journal of the tasks this command line submitted (DESIGN 19), listed,
and collected: every task whose results are not saved yet (a submit whose answer was lost sent
again with its key, a replay), waited on with ``--wait``, and saved soonest-expiring first."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import _exit
from ._command import OutputDir, RunTimeout, interrupted, ready_folder, refuse, session
from ._globals import LOCAL, current, with_globals, with_globals_of
from ._output import Output
from ._resume import collect_command
from ._runtime import journal_path, make_async_client, open_journal
from ._when import iso_utc

if TYPE_CHECKING:
    from imggw_client.tracking import Journal, JournalEntry

# Named where the root adds it (``tasks``).
app = typer.Typer(invoke_without_command=True)

NO_JOURNAL = "no journal: the command line keeps none (--no-journal, IMGGW_JOURNAL=off, --mock)"


@app.callback(epilog=_exit.EPILOG)
@with_globals_of(*LOCAL, "no_journal")
def tasks(
    ctx: typer.Context,
    unfinished: Annotated[
        bool,
        typer.Option("--unfinished", help="Only tasks still to wait on or to save."),
    ] = False,
) -> None:
    """List the tasks submitted from this machine's command line, newest first: id, surface,
    status, when submitted, when its links expire, the files saved. Kept in a journal
    (IMGGW_JOURNAL, else the XDG state folder) before each submit leaves.

    Example: imggw tasks --unfinished; imggw tasks collect -o out/ --wait
    """
    if ctx.invoked_subcommand is not None:
        return
    with session() as out:
        journal = _journal()
        try:
            entries = journal.tasks(unfinished=unfinished)
        finally:
            journal.close()
        for entry in entries:
            out.data(entry.as_json(), [_line(entry)])
        if not entries:
            out.note("no tasks in the journal" + (" still to collect" if unfinished else ""))


@app.command("collect", epilog=_exit.EPILOG)
@with_globals
def collect(
    output: OutputDir = Path("."),
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for tasks still running (default: report them).")
    ] = False,
    timeout: RunTimeout = None,
) -> None:
    """Save the results of every journaled task of this key and gateway not saved yet.

    A submit whose answer never came is sent again with its key (the gateway replays the task,
    never bills it twice). Results are saved soonest-expiring first, as
    <surface>-<task id>-<n>.<ext> (a journal holds both surfaces' tasks). Exit 0 when all
    are saved, 3 when some still run (without --wait), 1 when some failed or expired.

    Example: imggw tasks collect -o out/ --wait --timeout 900
    """
    import anyio

    from imggw_client.tracking import CollectReport, Tracker

    flags = current()
    with session() as out:
        journal = _journal()
        ready_folder(output, out)

        async def main() -> CollectReport:
            async with make_async_client(flags, journal=journal) as client:
                return await Tracker(client).collect(output, wait=wait, timeout=timeout)

        try:
            report = anyio.run(main)
        except KeyboardInterrupt:
            interrupted(out, "interrupted; run the same command to go on")
        finally:
            journal.close()
        _report(out, report, resume=collect_command(output, flags))
    raise typer.Exit(report.exit_code)


def _journal() -> "Journal":
    """The command line's journal, or a usage error when it keeps none."""
    options = current()
    if options.mock or options.no_journal or journal_path() is None:
        refuse(NO_JOURNAL)
    found = open_journal(options)
    if isinstance(found, bool):  # the default one could not be opened (already warned)
        refuse(NO_JOURNAL)
    return found


def _report(out: Output, report: Any, *, resume: str) -> None:
    for task_id in report.saved:
        files = report.files[task_id]
        record: dict[str, Any] = {"task_id": task_id, "status": "succeeded",
                                  "files": [str(f.path) for f in files]}  # fmt: skip
        out.data(record, [str(f.path) for f in files])
    if report.running:
        out.warn(f"{len(report.running)} task(s) still running: run `{resume}` to wait for them",
                 event="still_running", task_ids=report.running, resume=resume)  # fmt: skip
    for task_id in report.failed:
        out.warn(f"task {task_id} failed: nothing to save", event="task_failed", task_id=task_id)
    for task_id in report.expired:
        out.warn(f"task {task_id}'s links expired before they were saved", event="expired",
                 task_id=task_id)  # fmt: skip
    out.note(f"saved {len(report.saved)}, running {len(report.running)}, failed "
             f"{len(report.failed)}, expired {len(report.expired)}", event="collected")  # fmt: skip


def _line(entry: "JournalEntry") -> str:
    when = iso_utc(entry.submitted_at) if entry.submitted_at else "-"
    expires = iso_utc(entry.expires_at) if entry.expires_at else "-"
    files = ",".join(str(p) for p in entry.files) or "-"
    return (f"{entry.task_id or '(unknown)'}  {entry.surface}  {entry.state}  {when}  "
            f"{expires}  {files}")  # fmt: skip
