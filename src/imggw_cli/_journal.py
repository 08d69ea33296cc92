"""``imggw tasks``: the journal of the tasks this command line submitted (DESIGN 19 and 22),
listed (the newest 50 by default), pruned of old final rows, and collected: every task whose
results are not saved yet (a submit whose answer was lost sent again with its key, a replay),
waited on with ``--wait``, and saved soonest-expiring first."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from . import _exit
from ._command import OutputDir, RunTimeout, interrupted, ready_folder, refuse, session
from ._globals import LOCAL, current, with_globals, with_globals_of
from ._output import Output, file_records
from ._resume import collect_command, resend_command
from ._runtime import journal_path, make_async_client, open_journal
from ._when import iso_utc, span

if TYPE_CHECKING:
    from imggw_client.tracking import CollectReport, Journal, JournalEntry

# Named where the root adds it (``tasks``).
app = typer.Typer(invoke_without_command=True)

NO_JOURNAL = "no journal: the command line keeps none (--no-journal, IMGGW_JOURNAL=off, --mock)"
SHOWN = 50  # rows `imggw tasks` lists unless --limit or --all says otherwise
PROMPT_WIDTH = 40  # characters of a prompt a listed row shows
COLUMNS = ("TASK ID", "SURFACE", "STATE", "CREATED", "PROMPT", "FILES")
PRUNE_AFTER = "30d"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


@app.callback(epilog=_exit.EPILOG)
@with_globals_of(*LOCAL, "no_journal")
def tasks(
    ctx: typer.Context,
    unfinished: Annotated[
        bool,
        typer.Option("--unfinished", help="Only tasks still to wait on or to save."),
    ] = False,
    limit: Annotated[
        Optional[int],  # noqa: UP045 - Typer wants this spelling on Python 3.10
        typer.Option(
            "--limit", min=1, metavar="N", help=f"List the newest N tasks [default: {SHOWN}]."
        ),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="List every task.")] = False,
    state: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--state",
            metavar="STATE",
            help="Only tasks in this state (repeatable): unknown, pending, running, "
            "succeeded, saved, failed, expired, not_found.",
        ),
    ] = None,
    folder: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--folder",
            metavar="DIR",
            help="List the tasks of a batch output folder (imggw batch, download --from; "
            "a sharded run's from every shard) in place of the journal.",
        ),
    ] = None,
) -> None:
    """List the tasks submitted from this machine's command line, newest first: a header, then
    each task's id, surface, state, when it was first sent, its prompt (cut short) and the
    files saved; the newest 50 unless --limit N or --all. Kept in a journal (IMGGW_JOURNAL,
    else the XDG state folder) before each submit leaves. --json: one object per task.

    A batch output folder keeps its run's tasks in a file of the same kind: --folder DIR lists
    them the same way (its run collects and resumes them: imggw batch run); a sharded run's,
    from every shard, the last shard's first.

    Example: imggw tasks --unfinished; imggw tasks --state failed --limit 10; imggw tasks
    --folder out/; imggw tasks collect -o out/ --wait; imggw tasks prune --older-than 7d
    """
    if ctx.invoked_subcommand is not None:
        if folder is not None:  # a prune or collect there would act on the journal instead
            refuse(
                f"--folder lists a folder's tasks; tasks {ctx.invoked_subcommand} works on "
                "the journal"
            )
        return
    if every and limit is not None:
        refuse("give --all or --limit N, not both")
    shown = None if every else (limit or SHOWN)
    with session() as out:
        journals, recut = _in_folder(folder) if folder is not None else ([_journal()], False)
        try:
            entries, total = _listed(journals, unfinished, shown, state, recut=recut)
        finally:
            for journal in journals:
                journal.close()
        if not entries:
            out.note(
                ("no tasks in the folder" if folder else "no tasks in the journal")
                + (" still to collect" if unfinished and not folder else "")
                + (" unfinished" if unfinished and folder else "")
                + (" in that state" if state else "")
            )
            return
        _list(out, entries)
        if total > len(entries):
            out.note(
                f"{len(entries):,} of {total:,} tasks; --all or --limit N shows more",
                event="more_tasks",
                shown=len(entries),
                total=total,
            )


def _listed(
    journals: "list[Journal]",
    unfinished: bool,
    shown: Optional[int],  # noqa: UP045
    state: Optional[list[str]],  # noqa: UP045
    *,
    recut: bool = False,
) -> "tuple[list[JournalEntry], int]":
    """The newest ``shown`` entries (all with None) and how many there are in all, from
    ``journals`` newest first (a sharded run's: its last shard first). ``recut``: a folder run
    in more than one cut (a run of its own, then shards; shards of another count), whose
    ledgers may hold the same task: each is listed once, and every row is read to count them
    (only such a folder pays that)."""
    from imggw_client import RequestValidationError
    from imggw_client.text import printable

    entries: list[JournalEntry] = []
    try:
        for journal in journals:
            want = None if shown is None or recut else shown - len(entries)
            if want == 0:
                break
            entries += journal.tasks(unfinished=unfinished, limit=want, states=state)
    except RequestValidationError as err:  # a state the core does not name
        refuse(f"--state {printable(err.rule, 200)}")
    if recut:
        seen: set[tuple[str, str]] = set()
        once = []
        for entry in entries:
            task = (entry.surface, entry.task_id) if entry.task_id else ("", entry.idempotency_key)
            if task not in seen:
                seen.add(task)
                once.append(entry)
        return once[:shown], len(once)
    if shown is None or len(entries) < shown:  # every one of them is here: no count needed
        return entries, len(entries)
    return entries, sum(j.count(unfinished=unfinished, states=state) for j in journals)


def _list(out: Output, entries: "list[JournalEntry]") -> None:
    """The entries: with --json one object each, else a header and one aligned line each."""
    if out.json:
        for entry in entries:
            out.data(entry.as_json(), [])
        return
    rows = [COLUMNS, *(_cells(entry) for entry in entries)]
    # The last column is not padded: its width is the files', and nothing follows it.
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    for row in rows:
        *padded, last = row
        out.data(
            {}, ["  ".join([*(c.ljust(w) for c, w in zip(padded, widths, strict=True)), last])]
        )


def _cells(entry: "JournalEntry") -> tuple[str, ...]:
    """A listed row's cells, each made printable: a task id, a prompt and a path are text
    that a gateway or a user chose."""
    from imggw_client.text import printable

    created = entry.created_at or entry.submitted_at
    files = ", ".join(printable(str(path)) for path in entry.files) or "-"
    prompt = entry.request.prompt
    return (
        printable(entry.task_id, 40) if entry.task_id else "(unknown)",
        entry.surface,
        entry.state,
        iso_utc(created.replace(microsecond=0)) if created else "-",
        # Cut before it is made printable: a prompt may hold 20,000 characters.
        printable(prompt[: PROMPT_WIDTH * 2], PROMPT_WIDTH),
        files,
    )


@app.command("prune", epilog=_exit.EPILOG)
@with_globals_of(*LOCAL, "no_journal")
def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Remove final tasks (saved, failed, expired, not_found) last changed "
            "longer ago than this: 30d, 12h, 90m, 3600s.",
        ),
    ] = PRUNE_AFTER,
) -> None:
    """Remove old finished tasks from the journal: those saved, failed, expired or no longer
    known to the gateway, last changed longer ago than --older-than (default 30 days). Tasks
    still to resend, wait on or save are never removed. Says how many went (--json: one
    object on stdout).

    Example: imggw tasks prune --older-than 7d
    """
    seconds = duration(older_than)
    with session() as out:
        journal = _journal()
        try:
            removed = journal.prune(older_than=seconds)
        finally:
            journal.close()
        if out.json:
            out.data({"removed": removed, "older_than": seconds, "journal": str(journal.path)}, [])
        else:
            out.note(
                f"removed {removed:,} task(s) finished more than {span(seconds)} ago "
                f"from {journal.path}",
                event="pruned",
                removed=removed,
            )


def duration(text: str) -> float:
    """``--older-than``'s value in seconds: a number and one of the units s, m, h, d (``30d``,
    ``12h``, ``90m``, ``3600s``); else exit 2 with one line saying so.
    """
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        from imggw_client.text import printable

        refuse(
            f"--older-than must be a duration such as 30d, 12h, 90m or 3600s "
            f"(got {printable(text, 40)!r})"
        )
    return float(found.group(1)) * _UNITS[found.group(2)]


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
    never bills it twice), unless it was first sent longer ago than the gateway remembers keys
    (IMGGW_IDEMPOTENCY_WINDOW, default 24 h): such a submit is named with the command that
    sends it, if you choose to, and not sent. Results are saved soonest-expiring first, as
    <task id>-<n>.<ext>, as generate saves them (a task of the other surface:
    <surface>-<task id>-<n>.<ext>). Tasks of another key
    or gateway are counted on stderr and left alone: they do not change the exit code. Exit 0
    when all are saved, 3 when some still run (without --wait), 1 when some failed, expired,
    are unknown to the gateway, or were not sent again.

    Example: imggw tasks collect -o out/ --wait --timeout 900
    """
    import anyio

    from imggw_client.tracking import Tracker

    flags = current()
    with session() as out:
        journal = _journal()
        ready_folder(output, out)
        window: list[float] = []

        async def main() -> "CollectReport":
            async with make_async_client(flags, journal=journal) as client:
                window.append(client.idempotency_window)
                # An absolute folder: the journal keeps where the files are, wherever the
                # next command is run from.
                return await Tracker(client).collect(output.absolute(), wait=wait, timeout=timeout)

        try:
            report = anyio.run(main)
            stale = _stale_entries(journal, report)
        except KeyboardInterrupt:
            interrupted(out, "interrupted; run the same command to go on")
        finally:
            journal.close()
        _report(out, report, resume=collect_command(output, flags))
        _stale(out, stale, window[0] if window else None)
        _elsewhere(out, report.other_scopes)
        if report.held:  # said even with --quiet, as _elsewhere's: not a complete collect
            out.warn(
                f"{report.held} unfinished task(s) of this key and gateway are held by another "
                "live process (it submitted them, or collects them): run collect again once "
                "it has ended",
                event="held",
                held=report.held,
            )
    raise typer.Exit(report.exit_code)


def _in_folder(folder: Path) -> "tuple[list[Journal], bool]":
    """A batch ``folder``'s tasks: its ledger, or a sharded run's, one a shard (the last
    first), and whether the folder was run in more than one cut (see :func:`_listed`); or a
    usage error when it is no folder."""
    from imggw_client.batch import ledger_folders, shard_of
    from imggw_client.text import printable
    from imggw_client.tracking import Journal

    if not folder.is_dir():  # a file would open as a journal, or be made one
        what = "is a file: give the folder it is in" if folder.exists() else "no such folder"
        refuse(f"--folder {printable(str(folder), 200)}: {what}")
    folder = folder.absolute()
    folders = ledger_folders(folder) or [folder]
    # A cut: the folder's own run (None), or its shards of one count.
    shards = [shard_of(found) if found != folder else None for found in folders]
    cuts = {shard[1] if shard else None for shard in shards}
    opened: list[Journal] = []
    try:
        for found in reversed(folders):
            opened.append(Journal(found))
    except BaseException:
        for journal in opened:
            journal.close()
        raise
    return opened, len(cuts) > 1


def _journal() -> "Journal":
    """The command line's journal, or a usage error when it keeps none."""
    options = current()
    if options.mock or options.no_journal or journal_path() is None:
        refuse(NO_JOURNAL)
    found = open_journal(options)
    if isinstance(found, bool):  # the default one could not be opened (already warned)
        refuse(NO_JOURNAL)
    return found


def _report(out: Output, report: "CollectReport", *, resume: str) -> None:
    for task_id in report.saved:
        files = report.files[task_id]
        record: dict[str, Any] = {
            "task_id": task_id,
            "status": "succeeded",
            "files": file_records(files),
        }
        out.data(record, [str(f.path) for f in files])
    if report.running or report.unresolved_keys:
        left = len(report.running) + len(report.unresolved_keys)
        out.warn(
            f"{left} task(s) still running: run `{resume}` to wait for them",
            event="still_running",
            task_ids=report.running,
            idempotency_keys=report.unresolved_keys,
            resume=resume,
        )
    for task_id in report.failed:
        out.warn(f"task {task_id} failed: nothing to save", event="task_failed", task_id=task_id)
    for task_id in report.expired:
        out.warn(
            f"task {task_id}'s links expired before they were saved",
            event="expired",
            task_id=task_id,
        )
    for task_id in report.not_found:
        out.warn(
            f"task {task_id}: the gateway no longer knows it; nothing to save",
            event="not_found",
            task_id=task_id,
        )
    out.note(
        f"saved {len(report.saved)}, running {len(report.running)}, failed "
        f"{len(report.failed)}, expired {len(report.expired)}, not found "
        f"{len(report.not_found)}, not sent again {len(report.stale_keys)}",
        event="collected",
    )


def _stale_entries(journal: "Journal", report: "CollectReport") -> "list[JournalEntry]":
    """The journal's rows of the submits the collect did not send again (their requests, for
    the command that sends one); a key whose row is gone meanwhile is left out."""
    if not report.stale_keys:
        return []
    keys = set(report.stale_keys)
    unknown = journal.tasks(states=["unknown"])
    return [entry for entry in unknown if entry.idempotency_key in keys]


def _stale(out: Output, entries: "list[JournalEntry]", window: Optional[float]) -> None:  # noqa: UP045
    """Each submit not sent again because the gateway may have forgotten its key: its key, and
    the command that sends it anyway (a second task may be billed: the user's call). The prompt
    is never printed: ``imggw tasks --state unknown --json`` shows it."""
    remembered = f" ({span(window)})" if window else ""
    for entry in entries:
        request = (entry.request.aspect_ratio, entry.request.resolution)
        command = resend_command(
            "submit", entry.surface, request, entry.idempotency_key, None, current()
        )
        out.warn(
            f"not sent again: the submit with idempotency key {entry.idempotency_key}, first "
            f"sent longer ago than the gateway remembers keys{remembered}. If no task came of "
            f"it, send it yourself (a second task may be billed): {command} (its prompt: imggw "
            "tasks --state unknown --json)",
            event="key_forgotten",
            idempotency_key=entry.idempotency_key,
            resend=command,
        )


def _elsewhere(out: Output, count: int) -> None:
    """Unfinished tasks this collect left alone: another key's, or another gateway's (or
    another spelling of this one's URL). Said even with --quiet: a collect that saved nothing
    would otherwise look complete."""
    if count:
        out.warn(
            f"{count} unfinished task(s) in the journal belong to another API key or "
            "gateway (another spelling of the base URL counts as another): collect them "
            "with that IMGGW_API_KEY and --base-url, as submitted; `imggw tasks --unfinished "
            "--json` shows each one's gateway",
            event="other_scopes",
            other_scopes=count,
        )
