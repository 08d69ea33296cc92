"""A batch run in this process into a local folder (``imggw batch``, ``imggw download
--from``): its live display, the manifest on stdout, the summary, the exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ._command import interrupted, session
from ._globals import current
from ._runtime import make_async_client

BATCH_INTERRUPTED = "interrupted; every line's progress is saved: run the same command to resume"


def run_local(source: str, output: Path, **options: Any) -> None:
    """A batch (or a collect, for ``download --from``) in this process into a local folder: its
    live display, the manifest on stdout, the summary; exits with the run's code."""
    import anyio

    from imggw_client.batch import arun_batch

    from ._batch_display import batch_display, batch_summary, report_stop_line

    flags = current()
    with session() as out:

        async def main() -> Any:
            async with make_async_client(flags) as client:
                with batch_display(out) as on_progress:
                    return await arun_batch(source, output, client=client,
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
