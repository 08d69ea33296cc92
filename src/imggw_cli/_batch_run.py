"""A batch run in this process into a local folder (``imggw batch``, ``imggw download
--from``) and how a batch shows itself on stderr: a live bar and table on a terminal, a
parseable line every few seconds otherwise (and always with --log-format json, each line a
JSON object with its counts), the manifest on stdout, the summary at the end (one JSON object
with --log-format json), the lines that failed, the exit code. A run on Dask (``_scale``) shows
itself the same way."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from imggw_client.text import printable

from . import _output
from ._command import interrupted, refuse, session
from ._globals import current
from ._output import Output, spent, stdout
from ._runtime import make_async_client, open_journal
from ._when import iso_utc, span, until

if TYPE_CHECKING:
    from imggw_client.batch import BatchProgress, BatchReport

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
    if text is None:
        return PROGRESS_EVERY
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
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


# One word per line state, as the manifest and `imggw batch status` say them: pending,
# running, succeeded (files saved), failed (results that expired before they were saved
# included: error result_expired). The display alone splits `running` in two: `running` while
# the task runs, `downloading` once it succeeded and its files are being saved (the SDK's
# `words` of a progress or a report).
WORDS = ("pending", "running", "downloading", "succeeded", "failed")


PROGRESS_EVERY = 30.0  # seconds at most between progress lines (--progress-every)
CHANGES_EVERY = 2.0  # seconds at least between lines while lines move
GATEWAY_SILENT = 60.0  # seconds the gateway answers nothing before it is warned about


class _Warnings:
    """What a run is warned about once, --quiet or not: results about to expire unseen, and a
    gateway asked and silent for ``silent_after`` seconds (with a note when it answers again,
    and a warning again if it falls silent again)."""

    def __init__(self, out: Output, silent_after: float) -> None:
        self.out, self.silent_after = out, silent_after
        self.at_risk = False
        self.silent = 0.0  # the longest silence seen since the warning (0: no warning out)

    def __call__(self, progress: BatchProgress) -> None:
        out, silence = self.out, progress.gateway_silent_for
        if progress.at_risk > 0 and not self.at_risk:
            self.at_risk = True
            out.warn(
                f"{progress.at_risk} results will expire before their download turn at "
                "the current pace; raise --concurrency",
                event="at_risk",
                at_risk=progress.at_risk,
            )
        if silence >= self.silent_after and not self.silent:
            out.warn(
                f"no answer from the gateway for {span(silence)}; still trying",
                event="gateway_silent",
                silent_for=round(silence, 1),
            )
        if self.silent and silence < self.silent_after:  # only an answer shortens a silence
            out.note(
                f"the gateway answers again, after {span(self.silent)} without an answer",
                event="gateway_answers",
                silent_for=round(self.silent, 1),
            )
            self.silent = 0.0
        elif silence >= self.silent_after:
            self.silent = max(self.silent, silence)


@contextmanager
def batch_display(
    out: Output,
    *,
    progress_every: float = PROGRESS_EVERY,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Callable[[BatchProgress], None]]:
    """An ``on_progress`` for batches: a live bar and table on a terminal; otherwise (and with
    --log-format json) a line when lines move (at most every :data:`CHANGES_EVERY` seconds)
    and at least every ``progress_every`` seconds while none moves, as ``rclone --stats``
    does; no progress with --quiet. Warned once, --quiet or not: results about to expire
    unseen, and a gateway that answers nothing for :data:`GATEWAY_SILENT` seconds.
    """
    warn = _Warnings(out, GATEWAY_SILENT)
    if out.quiet:
        yield warn
        return
    if _output.is_json() or not sys.stderr.isatty():
        said: list[Any] = [-math.inf, None, None]  # when the last line was, its counts, its guard

        def line(progress: BatchProgress) -> None:
            now, (last, counts, stopped) = clock(), said
            # A guard's stop is said at once: the next line may be a task's length away.
            news = progress.stopped_by != stopped
            moved = progress.counts != counts and (
                now - last >= CHANGES_EVERY or progress.finished == progress.total
            )
            if moved or news or now - last >= progress_every:
                said[:] = [now, progress.counts, progress.stopped_by]
                out.note(
                    progress_text(progress), event="batch_progress", **progress_fields(progress)
                )
            warn(progress)

        yield line
        return
    from rich.console import Console
    from rich.live import Live

    with Live(console=Console(stderr=True), refresh_per_second=4, transient=True) as live:

        def draw(progress: BatchProgress) -> None:
            live.update(progress_view(progress))
            warn(progress)

        yield draw


def _budget(p: BatchProgress) -> str | None:
    """``budget 2 submits/s, 10 queries/s; the 40 lines left need at least 20 s``."""
    limit = p.rate_limit
    if limit is None:
        return None
    kinds = {"submits": limit.submits_per_second, "queries": limit.queries_per_second}
    rates = [f"{rate:g} {kind}/s" for kind, rate in kinds.items() if rate is not None]
    if not rates:
        return None
    text = "budget " + ", ".join(rates)
    if p.least_time_left is not None:
        left = p.words["pending"]
        text += f"; the {left} lines left need at least {span(p.least_time_left)}"
    return text


def _typical(p: BatchProgress) -> str | None:
    """``tasks take about 42 s (1k), 1 min 20 s (4k)``: what the polls go by (DESIGN 15)."""
    if not p.typical_durations:
        return None
    times = [f"{_seconds(took)} ({res})" for res, took in p.typical_durations.items()]
    return "tasks take about " + ", ".join(times)


def _seconds(took: float) -> str:
    return f"{took:.1f} s" if took < 10 else span(took)


def _downloads(p: BatchProgress) -> str | None:
    """``awaiting download 3, soonest expiry in 23 h 59 min``."""
    if not p.awaiting_download and p.soonest_expiry is None:
        return None
    text = f"awaiting download {p.awaiting_download}"
    if p.soonest_expiry is not None:
        text += f", soonest expiry {until(p.soonest_expiry)}"
    return text


def cost_text(cost: float, unknown: int) -> str:
    """``0.03``; ``unknown`` when every line charged stated no cost (surface alpha states
    credits only: the cost is not zero, it is not known); ``0.03 + unknown (2 lines)`` for a
    mix."""
    if not unknown:
        return f"{cost:g}"
    if not cost:
        return "unknown"
    return f"{cost:g} + unknown ({unknown} lines)"


def _money(p: BatchProgress) -> str:
    """``credits 36/40, cost 0.09``: what the folder's run was charged, against its caps."""
    credits = f"{p.credits:g}" + ("" if p.max_credits is None else f"/{p.max_credits:g}")
    cost = cost_text(p.cost, p.cost_unknown) + ("" if p.max_cost is None else f"/{p.max_cost:g}")
    stopped = f" (stopped by {p.stopped_by}: lines sent are finishing)" if p.stopped_by else ""
    return f"credits {credits}, cost {cost}{stopped}"


def _guards() -> dict[str, tuple[str, str]]:
    """Each guard's flag, and what resumes a run it stopped."""
    from imggw_client import batch

    return {
        batch.MAX_CREDITS: ("--max-credits", "raise --max-credits"),
        batch.MAX_COST: ("--max-cost", "raise --max-cost"),
        batch.MAX_FAILURES: ("--max-failures", "raise --max-failures (or mend the failing lines)"),
        batch.INSUFFICIENT_CREDITS: (
            f"the gateway ({batch.INSUFFICIENT_CREDITS})",
            "top up the account",
        ),
    }


def stop_line(stopped_by: str | None, why: str, spent: str | None = None) -> str | None:
    """The one line of a run a guard stopped: which, what it saw (what was spent against the
    cap, or the most frequent error), and what resumes it; None for a run none stopped."""
    if stopped_by is None:
        return None
    flag, then = _guards().get(stopped_by, (stopped_by, "raise the limit"))
    said = f" ({printable(why)})" if why else ""
    charged = f"; the run's lines were charged {spent}" if spent else ""
    return (
        f"stopped by {flag}{said}{charged}; lines already sent were finished and saved. "
        f"To resume: {then} and run the same command again"
    )


def report_stop_line(report: BatchReport) -> str | None:
    """:func:`stop_line` of a run's report, with what its lines were charged against the caps."""
    limits = ((report.max_credits, "credits"), (report.max_cost, "cost"))
    caps = [f"{cap:g} {unit}" for cap, unit in limits if cap is not None]
    spent = f"{report.credits:g} credits, cost {cost_text(report.cost, report.cost_unknown)}"
    if caps:
        spent += f" (caps: {' and '.join(caps)})"
    return stop_line(report.stopped_by, report.stop_reason, spent)


def progress_text(p: BatchProgress) -> str:
    """One line, ``; ``-separated parts, the first three always there: for logs and scripts."""
    counts = ", ".join(f"{word} {n}" for word, n in p.words.items() if n)
    eta = "" if p.eta is None else f", eta {p.eta:.0f}s"
    parts = [
        f"batch: {p.finished}/{p.total} finished ({counts})",
        f"{p.throughput:.1f}/s{eta}",
        _money(p),
        _budget(p),
        _typical(p),
        _downloads(p),
    ]
    return "; ".join(part for part in parts if part)


def spent_of(credits: float, cost: float, unknown: int, **caps: float | None) -> Any:
    """The ``spent`` field: credits, and the cost (null when no line charged stated one; see
    cost_text), the caps when set."""
    known = None if unknown and not cost else cost
    return spent(
        credits,
        known,
        cost_unknown=unknown,
        **{name: cap for name, cap in caps.items() if cap is not None},
    )


def progress_fields(p: BatchProgress) -> dict[str, Any]:
    """A progress line's fields for --log-format json: what :func:`progress_text` says."""
    return {
        "finished": p.finished,
        "total": p.total,
        "counts": p.words,
        "throughput": round(p.throughput, 3),
        "eta": None if p.eta is None else round(p.eta, 1),
        "elapsed": round(p.elapsed, 1),
        "spent": spent_of(
            p.credits, p.cost, p.cost_unknown, max_credits=p.max_credits, max_cost=p.max_cost
        ),
        "stopped_by": p.stopped_by,
        "awaiting_download": p.awaiting_download or None,
        "soonest_expiry": None if p.soonest_expiry is None else iso_utc(p.soonest_expiry),
        "least_time_left": p.least_time_left,
        "typical_durations": p.typical_durations or None,
    }


def progress_view(p: BatchProgress) -> Any:
    """The live view: one bar for the whole batch, the counts per state under it, then the
    budget and the downloads waiting."""
    from rich import box
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    eta = "-" if p.eta is None else span(p.eta)
    bar = Table.grid(padding=(0, 1))
    bar.add_row(
        "batch",
        ProgressBar(total=max(p.total, 1), completed=p.finished, width=40),
        f"{p.finished}/{p.total}  {p.throughput:.1f} lines/s  eta {eta}  {_money(p)}",
    )
    counts = Table(box=box.SIMPLE_HEAD, show_edge=False)
    per_word = p.words
    for word in WORDS:
        counts.add_column(word, justify="right")
    counts.add_row(*(str(n) for n in per_word.values()))
    notes = [f"elapsed {span(p.elapsed)}", _budget(p), _typical(p), _downloads(p)]
    return Group(bar, counts, *(note for note in notes if note))


def batch_summary(out: Output, report: BatchReport) -> None:
    if out.quiet:
        return
    if _output.is_json():
        _summary_record(out, report)
    else:
        _summary_table(report)
    _summary_notes(out, report)


def _summary_record(out: Output, report: BatchReport) -> None:
    """The summary as one JSON object: what the table says."""
    from imggw_client.batch import LineState

    counts = report.words
    said = ", ".join(f"{word} {n}" for word, n in counts.items() if n)
    cost = cost_text(report.cost, report.cost_unknown)
    out.note(
        f"batch summary: {report.total} lines ({said}); credits {report.credits:g}, cost {cost}, "
        f"{report.elapsed:.1f}s; manifest {report.manifest}",
        event="batch_summary",
        total=report.total,
        counts=counts,
        expired=report.counts.get(LineState.EXPIRED, 0),
        bad_lines=report.bad_count,
        changed_lines=report.changed_count,
        removed_lines=report.removed_count,
        comments=report.comments,
        spent=spent_of(
            report.credits,
            report.cost,
            report.cost_unknown,
            max_credits=report.max_credits,
            max_cost=report.max_cost,
        ),
        elapsed=round(report.elapsed, 1),
        manifest=str(report.manifest),
        exit_code=int(report.exit_code),
    )


def _summary_table(report: BatchReport) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from imggw_client.batch import LineState

    table = Table(title="batch summary", title_justify="left", show_header=False)
    per_word = report.words
    expired = report.counts.get(LineState.EXPIRED, 0)
    labels = {
        "succeeded": "succeeded (files saved)",
        "failed": f"failed ({expired} of them: results expired)" if expired else "failed",
        "downloading": "downloading (files not saved yet)",
        "running": "running (task not finished)",
        "pending": "pending (not submitted yet)",
    }
    for word, label in labels.items():
        if per_word[word]:
            table.add_row(label, str(per_word[word]))
    if report.bad_count:
        table.add_row("bad input lines (skipped)", str(report.bad_count))
    if report.comments:
        table.add_row("comment lines (skipped)", str(report.comments))
    if report.changed_count:
        table.add_row("new or changed lines (new requests)", str(report.changed_count))
    if report.removed_count:
        table.add_row("removed lines (nothing sent)", str(report.removed_count))
    cap = "" if report.max_credits is None else f" of {report.max_credits:g}"
    table.add_row("credits", f"{report.credits:g}{cap}")
    cap = "" if report.max_cost is None else f" of {report.max_cost:g}"
    table.add_row("cost", cost_text(report.cost, report.cost_unknown) + cap)
    table.add_row("elapsed", f"{report.elapsed:.1f}s")
    table.add_row("manifest", Text(printable(report.manifest)))  # a path: no markup
    Console(stderr=True).print(table)


def _summary_notes(out: Output, report: BatchReport) -> None:
    from imggw_client.batch import SHOWN_BAD_LINES

    for bad in report.bad_lines[:SHOWN_BAD_LINES]:
        out.note(
            f"line {bad.line}: {bad.reason} (skipped)",
            event="bad_line",
            line=bad.line,
            reason=bad.reason,
        )
    if report.bad_lines_file is not None:
        where = printable(report.bad_lines_file)
        out.note(f"all {report.bad_count} bad lines are listed in {where}")
    if report.previous_surface is not None:
        out.note(
            f"this folder's run was made on surface {report.previous_surface}; its lines were "
            "submitted again, as new requests, on this run's surface"
        )
    if report.changed_lines:
        shown = _numbers(report.changed_lines, report.changed_count)
        out.note(f"lines new or changed since the last run, submitted as new requests: {shown}")
    if report.removed_lines:
        shown = _numbers(report.removed_lines, report.removed_count)
        out.note(f"lines removed since the last run (as it numbered them), nothing sent: {shown}")
    if report.exit_code == 3:
        out.note("some lines are unfinished: run the same command again to resume them")


def _numbers(lines: list[int], count: int) -> str:
    return ", ".join(str(n) for n in lines[:10]) + (f" ... ({count} in all)" if count > 10 else "")
