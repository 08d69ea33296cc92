"""A batch run in this process into a local folder (``imggw batch``, ``imggw download
--from``): its live display, the manifest on stdout, the summary, the lines that failed, the
exit code."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from imggw_client.text import printable

from ._command import interrupted, refuse, session
from ._globals import current
from ._output import Output, stdout
from ._runtime import make_async_client, open_journal

if TYPE_CHECKING:
    from imggw_client.batch import BatchReport

BATCH_INTERRUPTED = "interrupted; every line's progress is saved: run the same command to resume"

ProgressEvery = Annotated[
    Optional[str],  # noqa: UP045 - Typer wants this spelling on Python 3.10
    typer.Option(
        "--progress-every",
        metavar="SECONDS",
        help="When stderr is not a terminal (or with --log-format json), a progress line at "
        "least this often, lines moving or not [default: 30].",
    ),
]


def progress_every(text: str | None) -> float:
    """``--progress-every``: a number of seconds > 0 (default 30), else exit 2 with one line."""
    import math

    from ._batch_display import PROGRESS_EVERY

    if text is None:
        return PROGRESS_EVERY
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        from imggw_client.text import printable

        refuse(
            f"--progress-every must be a number of seconds > 0 (got {printable(text, 40)!r}); "
            "nothing was sent"
        )
    return value


def run_local(
    source: str, output: Path, *, every: float, tasks: bool = False, **options: Any
) -> None:
    """A batch (or with ``tasks`` a list of tasks collected, for ``download --from``) in this
    process into a local folder: its live display (a progress line at least every ``every``
    seconds off a terminal), the manifest on stdout, the summary; exits with the run's code."""
    import anyio

    from imggw_client.batch import acollect_tasks, arun_batch

    driver = acollect_tasks if tasks else arun_batch

    from ._batch_display import batch_display, batch_summary, report_stop_line

    flags = current()
    with session() as out:
        # Tasks collected are the shell's too: the journal learns what is saved, so that
        # `imggw tasks` and `tasks collect` know (DESIGN 22). A batch keeps its own ledger.
        journal = open_journal(flags) if tasks else False

        async def main() -> Any:
            async with make_async_client(flags, journal=journal) as client:
                with batch_display(out, progress_every=every) as on_progress:
                    return await driver(
                        source, output, client=client, on_progress=on_progress, **options
                    )

        try:
            report = anyio.run(main)
        except KeyboardInterrupt:
            interrupted(out, BATCH_INTERRUPTED)  # Ctrl-C, SIGTERM or SIGHUP: exits 130/143/129
        finally:
            if not isinstance(journal, bool):
                journal.close()
        if flags.json:
            with report.manifest.open(encoding="utf-8") as manifest:
                for line in manifest:
                    stdout(line.rstrip("\n"))
        else:
            stdout(str(report.manifest))
        batch_summary(out, report)
        failed_lines(out, report)
        stopped = report_stop_line(report)
        if stopped is not None:  # said even with --quiet: it is why the run ends with 6
            out.warn(stopped, event="stopped", stopped_by=report.stopped_by)
    raise typer.Exit(report.exit_code)


FAILED_NAMED = 10  # failed lines named one by one at the end of a run; the rest are counted
BAD_LINE = "invalid_line"  # the batch's error code of a bad input line (named by the summary)


def failed_lines(out: Output, report: BatchReport) -> None:
    """The lines that failed, named even with --quiet (a run that exits 1 says why): the first
    few from the manifest, each with its task and error, then how many in all and where every
    line's status is. Bad input lines are the summary's (with --quiet, counted here)."""
    failed = report.words["failed"] - report.bad_count
    if failed > 0:
        named = _failed_rows(report, min(failed, FAILED_NAMED))
        for row in named:
            found = row.get("error")
            error: dict[str, Any] = found if isinstance(found, dict) else {}
            why = ": ".join(str(error[k]) for k in ("code", "message") if error.get(k))
            task = f" (task {row['task_id']})" if row.get("task_id") else ""
            out.warn(
                f"line {row.get('line')} failed{task}: {why or 'no reason given'}",
                event="line_failed",
                line=row.get("line"),
                task_id=row.get("task_id"),
                error=error or None,
            )
        more = f", {failed - len(named)} not named here" if failed > len(named) else ""
        out.warn(
            f"{failed} line(s) failed{more}: every line's status and error is in "
            f"{printable(report.manifest)}",
            event="failed_lines",
            failed=failed,
            manifest=str(report.manifest),
        )
    if out.quiet and report.bad_count:
        where = report.bad_lines_file or report.manifest
        out.warn(
            f"{report.bad_count} bad input line(s) skipped: listed in {printable(where)}",
            event="bad_lines",
            bad_lines=report.bad_count,
            listed_in=str(where),
        )


def _failed_rows(report: BatchReport, most: int) -> list[dict[str, Any]]:
    """The first ``most`` failed lines of the run's manifest, bad input lines left out (none
    when it cannot be read: the count still says how many)."""
    from imggw_client.batch import iter_manifest

    found: list[dict[str, Any]] = []
    try:
        for row in iter_manifest(report.manifest):
            error = row.get("error")
            bad = isinstance(error, dict) and error.get("code") == BAD_LINE
            if row.get("status") == "failed" and not bad:
                found.append(row)
                if len(found) >= most:
                    break
    except (OSError, ValueError):
        return found
    return found
