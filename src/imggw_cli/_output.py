"""Where output goes: data on stdout (plain lines, or one JSON object per result), everything
else on stderr (progress, notes, errors), so that ``--json`` output always parses."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ._globals import Globals

if TYPE_CHECKING:
    from imggw_client import DownloadedFile, Submission, Task
    from imggw_client.batch import BatchProgress, BatchReport


def task_record(task: Task, files: list[DownloadedFile] | None = None) -> dict[str, Any]:
    """The pinned ``--json`` fields of a task (DESIGN 6)."""
    record: dict[str, Any] = {
        "task_id": task.id,
        "status": task.status.value,
        "progress": task.progress,
        "image_urls": list(task.image_urls),
        "error": task.error.model_dump() if task.error else None,
    }
    if files is not None:
        record["files"] = [{"path": str(f.path), "sha256": f.sha256, "size": f.size} for f in files]
    return record


def submission_record(sub: Submission) -> dict[str, Any]:
    return {"task_id": sub.task_id, "idempotency_key": sub.idempotency_key, "surface": sub.surface}


class Output:
    def __init__(self, options: Globals) -> None:
        self.json = options.json
        self.quiet = options.quiet

    def data(self, record: dict[str, Any], lines: list[str]) -> None:
        """One result: its JSON object with --json, else its human lines."""
        if self.json:
            print(json.dumps(record), flush=True)
        else:
            for line in lines:
                print(line, flush=True)

    def note(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def error(self, text: str) -> None:
        print(f"error: {text}", file=sys.stderr, flush=True)

    @contextmanager
    def progress(self, task_id: str) -> Iterator[Callable[[Task], None]]:
        """An ``on_update`` callback drawing the task's state: a live bar on a terminal, a
        line per change otherwise, nothing with --quiet."""
        started = time.monotonic()
        if self.quiet:
            yield lambda task: None
            return
        if not sys.stderr.isatty():

            def line(task: Task) -> None:
                percent = "" if task.progress is None else f" {task.progress}%"
                elapsed = time.monotonic() - started
                self.note(f"task {task_id}: {task.status.value}{percent} ({elapsed:.1f}s)")

            yield line
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("task {task.fields[task_id]}"),
            TextColumn("{task.fields[state]:<9}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        row = bar.add_task("", total=100, task_id=task_id, state="submitted")

        def draw(task: Task) -> None:
            bar.update(row, completed=task.progress or 0, state=task.status.value)

        with bar:
            yield draw


@contextmanager
def batch_display(out: Output) -> Iterator[Callable[[BatchProgress], None]]:
    """An ``on_progress`` for batches: a live table on a terminal, a line every few seconds
    otherwise, nothing with --quiet."""
    if out.quiet:
        yield lambda progress: None
        return
    if not sys.stderr.isatty():
        last = [0.0]

        def line(progress: BatchProgress) -> None:
            now = time.monotonic()
            if now - last[0] >= 2.0 or progress.finished == progress.total:
                last[0] = now
                out.note(_progress_text(progress))

        yield line
        return
    from rich.console import Console
    from rich.live import Live

    with Live(console=Console(stderr=True), refresh_per_second=4, transient=True) as live:
        yield lambda progress: live.update(_progress_table(progress))


def _progress_text(p: BatchProgress) -> str:
    counts = ", ".join(f"{state} {n}" for state, n in sorted(p.counts.items()))
    eta = "" if p.eta is None else f", eta {p.eta:.0f}s"
    return (
        f"batch: {p.finished}/{p.total} finished ({counts}); {p.throughput:.1f}/s{eta}; "
        f"credits {p.credits:g}, cost {p.cost:g}"
    )


def _progress_table(p: BatchProgress) -> Any:
    from rich.table import Table

    table = Table(title=f"batch: {p.finished}/{p.total} finished", title_justify="left")
    for column in ("pending", "submitted", "succeeded", "done", "failed", "expired"):
        table.add_column(column, justify="right")
    states = ("pending", "submitted", "succeeded", "done", "failed", "expired")
    table.add_row(*(str(p.counts.get(state, 0)) for state in states))
    eta = "-" if p.eta is None else f"{p.eta:.0f}s"
    table.caption = (
        f"{p.throughput:.1f} lines/s, eta {eta}, elapsed {p.elapsed:.0f}s, "
        f"credits {p.credits:g}, cost {p.cost:g}"
    )
    return table


def batch_summary(out: Output, report: BatchReport) -> None:
    if out.quiet:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="batch summary", title_justify="left", show_header=False)
    labels = {
        "done": "succeeded, saved",
        "failed": "failed",
        "expired": "expired before download",
        "pending": "not yet submitted",
        "submitted": "still running",
        "succeeded": "not yet downloaded",
    }
    for state, label in labels.items():
        if report.counts.get(state):
            table.add_row(label, str(report.counts[state]))
    if report.bad_lines:
        table.add_row("bad input lines (skipped)", str(len(report.bad_lines)))
    if report.changed_lines:
        table.add_row("changed lines (new requests)", str(len(report.changed_lines)))
    table.add_row("credits", f"{report.credits:g}")
    table.add_row("cost", f"{report.cost:g}")
    table.add_row("elapsed", f"{report.elapsed:.1f}s")
    table.add_row("manifest", str(report.manifest))
    Console(stderr=True).print(table)
    for bad in report.bad_lines:
        out.note(f"line {bad.line}: {bad.reason} (skipped)")
    if report.changed_lines:
        shown = ", ".join(str(n) for n in report.changed_lines[:10])
        out.note(f"lines changed since the last run, submitted as new requests: {shown}")
    if report.exit_code == 3:
        out.note("some lines are unfinished: run the same command again to resume them")


def task_lines(task: Task) -> list[str]:
    lines = [f"task_id: {task.id}", f"status: {task.status.value}"]
    if task.progress is not None:
        lines.append(f"progress: {task.progress}%")
    lines += [f"image_url: {url}" for url in task.image_urls]
    if task.error:
        lines.append(f"error: {task.error.code}: {task.error.message}")
    return lines
