"""A batch run in this process into a local folder (``imggw batch``, ``imggw download
--from``): its live display, the manifest on stdout, the summary, the exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ._command import interrupted, refuse, session
from ._globals import current
from ._runtime import make_async_client

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
    """``--progress-every``: a number of seconds > 0 (default 30), else exit 2 with one line.

    Example::

        progress_every("60")   # 60.0
    """
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

        refuse(f"--progress-every must be a number of seconds > 0 (got {printable(text, 40)!r}); "
               "nothing was sent")  # fmt: skip
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

        async def main() -> Any:
            async with make_async_client(flags) as client:
                with batch_display(out, progress_every=every) as on_progress:
                    return await driver(source, output, client=client,
                                        on_progress=on_progress, **options)  # fmt: skip

        try:
            report = anyio.run(main)
        except KeyboardInterrupt:
            interrupted(out, BATCH_INTERRUPTED)  # Ctrl-C, SIGTERM or SIGHUP: exits 130/143/129
        if flags.json:
            with report.manifest.open(encoding="utf-8") as manifest:
                for line in manifest:
                    print(line.rstrip("\n"), flush=True)
        else:
            print(report.manifest, flush=True)
        batch_summary(out, report)
        stopped = report_stop_line(report)
        if stopped is not None:  # said even with --quiet: it is why the run ends with 6
            out.warn(stopped, event="stopped", stopped_by=report.stopped_by)
    raise typer.Exit(report.exit_code)
