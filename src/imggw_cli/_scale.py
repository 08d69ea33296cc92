"""``imggw batch`` beyond one process: one shard (``--shard I/N``), a run on Dask (``--engine
dask``), ``imggw batch merge`` and ``imggw batch status``. Dask is imported only here, and only
for ``--engine dask``: the single-machine commands never load it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer

from . import _exit, _output, _resume
from ._globals import Globals
from ._output import Output
from ._when import span

if TYPE_CHECKING:
    from imggw_client.batch import RunStatus, ShardedProgress, ShardReport


# What the dask extra installs: a ModuleNotFoundError naming another module is a bug, not a
# missing extra.
DASK_MODULES = ("dask", "distributed")
# Off a terminal, a progress line when the counts moved, and now and then when they did not
# (a log that stays silent for minutes looks like a hung run).
QUIET_FOR = 30.0
PROGRESS_EVERY = 2.0  # seconds between two readings of a Dask run's progress


@dataclass(frozen=True)
class Modes:
    """How a batch beyond one process runs: ``--engine``, ``--address``, ``--workers``,
    ``--shard``, ``--shard-size``, ``--scratch``."""

    engine: str | None = None
    address: str | None = None
    workers: int | None = None
    shard: str | None = None
    shard_size: int | None = None
    scratch: str | None = None

    @property
    def any(self) -> bool:
        return any(getattr(self, name) is not None for name in self.__dataclass_fields__)


def usage(out: Output, message: str) -> None:
    out.error(message, event="usage_error", exit_code=_exit.USAGE)
    raise typer.Exit(_exit.USAGE)


def check_modes(out: Output, flags: Globals, source: str, dest: str, modes: Modes) -> None:
    """Options that do not go together end the command before anything is read or sent."""
    from imggw_client.batch import is_url

    engine, address, workers, shard = modes.engine, modes.address, modes.workers, modes.shard
    shard_size, scratch = modes.shard_size, modes.scratch
    if shard is not None and engine is not None:
        usage(out, "--shard runs one shard with no engine: give --shard or --engine, not both")
    if engine is None and (address is not None or workers is not None or shard_size is not None):
        usage(out, "--address, --workers and --shard-size go with --engine dask")
    if engine is not None and (address is None) == (workers is None):
        usage(out, "--engine dask needs --address tcp://HOST:PORT or --workers N (one of them)")
    if scratch is not None and engine is None and shard is None and not is_url(dest):
        # Else a plain run would become a shard of one, whose work a later run without
        # --scratch would not see, and redo.
        usage(out, "--scratch is for a remote DEST, --shard or --engine: a local DEST needs none")
    if source == "-":  # every run here is cut into shards (a remote DEST too)
        usage(
            out,
            "standard input cannot be sharded (a remote DEST, --shard and --engine run "
            "shards): give FILE, not -",
        )
    if engine is not None and flags.mock:
        usage(out, "--mock is a gateway inside this process: workers cannot reach it")


def run_shard(
    out: Output,
    flags: Globals,
    source: str,
    dest: str,
    *,
    index: int,
    count: int,
    options: dict[str, Any],
    scratch: str | None,
) -> ShardReport:
    """One shard in this process, with the live display; its manifest is in the output folder."""
    import anyio

    from imggw_client.batch import BatchOptions, ShardSpec, arun_shard

    from ._batch_run import batch_display
    from ._runtime import make_async_client

    spec = ShardSpec(
        source=source,
        dest=dest,
        index=index,
        count=count,
        options=BatchOptions.of(options),
        scratch=scratch,
    )

    async def main() -> ShardReport:
        async with make_async_client(flags) as client:
            with batch_display(out) as on_progress:
                return await arun_shard(spec, client=client, on_progress=on_progress)

    return anyio.run(main)


def run_scaled(
    out: Output, flags: Globals, source: str, dest: str, modes: Modes, options: dict[str, Any]
) -> int:
    """A batch cut into shards (modes already checked): on the engine, or one shard here (all
    of them, merged, for one process into a remote folder); its exit code."""
    if modes.engine is not None:
        return run_engine(out, flags, source, dest, modes, options)
    from imggw_client.batch import MANIFEST_NAME, merge, parse_shard

    shard = modes.shard
    index, count = parse_shard(shard) if shard is not None else (1, 1)
    report = run_shard(
        out,
        flags,
        source,
        dest,
        index=index,
        count=count,
        options={**options, "surface": flags.surface},
        scratch=modes.scratch,
    )
    if shard is None:  # one process into a remote folder: the merge is ours to do
        code = merge(dest).exit_code
        print_manifest(flags, dest, MANIFEST_NAME)
        return code
    print_manifest(flags, dest, f"{report.folder}/{MANIFEST_NAME}")
    shard_summary(out, report, dest)
    return report.exit_code


def shard_summary(out: Output, report: ShardReport, dest: str) -> None:
    if out.quiet:
        _stopped(out, report.stopped_by, report.stop_reason)
        return
    from ._batch_run import cost_text, spent_of

    counts = ", ".join(f"{n} {state}" for state, n in sorted(report.counts.items()))
    first, last = report.lines.start, report.lines.stop - 1
    cost = cost_text(report.cost, report.cost_unknown)
    skipped = f"; {report.comments} comment line(s) skipped" if report.comments else ""
    out.note(
        f"shard {report.index}/{report.count} (lines {first}-{last}): {counts or 'no lines'}; "
        f"credits {report.credits:g}, cost {cost}, {report.elapsed:.1f}s{skipped}",
        event="shard_summary",
        shard=f"{report.index}/{report.count}",
        lines=[first, last],
        counts={str(state): n for state, n in sorted(report.counts.items())},
        spent=spent_of(report.credits, report.cost, report.cost_unknown),
        elapsed=round(report.elapsed, 1),
        manifest=report.manifest,
        comments=report.comments,
        exit_code=int(report.exit_code),
    )
    _changed(out, report.changed_lines)
    if report.exit_code == 3:
        out.note("some lines are unfinished: run the same command again to resume them")
    merge = _resume.merge_command(dest)
    out.note(f"shard manifest: {report.manifest}; when every shard has run: {merge}")
    _stopped(out, report.stopped_by, report.stop_reason)


def _stopped(out: Output, stopped_by: str | None, why: str) -> None:
    """A guard's stop, said even with --quiet: it is why the command ends with 6."""
    from ._batch_run import stop_line

    line = stop_line(stopped_by, why)
    if line is not None:
        out.warn(line, event="stopped", stopped_by=stopped_by)


def _changed(out: Output, lines: list[int]) -> None:
    """The lines a run sent as new requests, since they changed (with --allow-changes)."""
    if lines:
        shown = ", ".join(str(n) for n in lines[:10])
        out.note(f"lines changed since the last run, submitted as new requests: {shown}")


def sharded_text(p: ShardedProgress) -> str:
    """One line of a sharded run's progress, for logs and scripts: ``dask: 12/24 lines
    finished (pending 6, running 6, succeeded 11, failed 1); shards 1/4 ended; 3.2 lines/s``."""
    counts = ", ".join(f"{state} {n}" for state, n in p.counts.items())
    parts = [
        f"dask: {p.finished}/{p.total} lines finished ({counts})",
        f"shards {p.shards_ended}/{p.shards} ended",
        _pace(p),
    ]
    if p.bad:
        parts.append(f"{p.bad} bad input line(s) skipped")
    return "; ".join(parts)


def _pace(p: ShardedProgress) -> str:
    text = f"{p.throughput:.1f} lines/s"
    if p.throughput > 0:
        text += f", eta {span(max(0, p.total - p.finished) / p.throughput)}"
    return text


def sharded_view(p: ShardedProgress) -> Any:
    """The live view of a sharded run: one bar for every line of every shard, the counts and
    the shards under it."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    bar = Table.grid(padding=(0, 1))
    bar.add_row(
        "dask",
        ProgressBar(total=max(p.total, 1), completed=p.finished, width=40),
        f"{p.finished}/{p.total} lines  {_pace(p)}",
    )
    counts = "  ".join(f"{state} {n}" for state, n in p.counts.items())
    shards = f"shards {p.shards_ended}/{p.shards} ended  elapsed {span(p.elapsed)}"
    return Group(bar, Text(f"{counts}  {shards}"))


@contextmanager
def sharded_display(out: Output) -> Iterator[Callable[[ShardedProgress], None] | None]:
    """An ``on_progress`` for a sharded run, on stderr: a live bar on a terminal, else a line
    each time the counts move (a reading every few seconds) and now and then when they do not;
    none with --quiet."""
    if out.quiet:
        yield None
        return
    if _output.is_json() or not sys.stderr.isatty():
        shown: tuple[dict[str, int], int] | None = None
        shown_at = 0.0

        def line(progress: ShardedProgress) -> None:
            nonlocal shown, shown_at
            now, state = time.monotonic(), (progress.counts, progress.shards_ended)
            if state != shown or now - shown_at >= QUIET_FOR:
                shown, shown_at = state, now
                out.note(
                    sharded_text(progress),
                    event="batch_progress",
                    engine="dask",
                    finished=progress.finished,
                    total=progress.total,
                    counts=dict(progress.counts),
                    bad=progress.bad or None,
                    shards=progress.shards,
                    shards_ended=progress.shards_ended,
                    throughput=round(progress.throughput, 3),
                    elapsed=round(progress.elapsed, 1),
                )

        yield line
        return
    from rich.console import Console
    from rich.live import Live

    # Notes printed meanwhile (a shard that ended) go above the bar: Live redirects stderr.
    with Live(console=Console(stderr=True), refresh_per_second=4, transient=True) as live:
        yield lambda progress: live.update(sharded_view(progress))


def run_engine(
    out: Output, flags: Globals, source: str, dest: str, modes: Modes, options: dict[str, Any]
) -> int:
    """A run on Dask: shards dispatched, each reported as it ends, then the merge."""
    import anyio

    from imggw_client.batch import MANIFEST_NAME

    try:
        from imggw_client.batch import DEFAULT_SHARD_SIZE, ClientSpec, ShardOutcome, arun_sharded
    except ModuleNotFoundError as exc:
        if exc.name not in DASK_MODULES:
            raise
        out.error(
            "--engine dask needs Dask: pip install 'imggw[dask]'", exit_code=_exit.AUTH_OR_CONFIG
        )
        raise typer.Exit(_exit.AUTH_OR_CONFIG) from None

    # --base-url reads IMGGW_BASE_URL itself (its envvar): flags.base_url has it already.
    client = ClientSpec(base_url=flags.base_url or None, surface=flags.chosen_surface)
    engine_options: dict[str, Any] = {"scratch": modes.scratch}
    if modes.shard_size is not None:
        engine_options["shard_size"] = modes.shard_size
    where = modes.address or f"a local cluster of {modes.workers} worker(s)"
    size = DEFAULT_SHARD_SIZE if modes.shard_size is None else modes.shard_size
    from ._runtime import adopt

    adopt("distributed")  # its own stderr lines, as JSON objects with --log-format json
    out.note(f"running shards of {size} lines on {where}")

    def on_shard(outcome: ShardOutcome) -> None:
        tries = f" after {outcome.attempts} tries" if outcome.attempts > 1 else ""
        if outcome.report is not None:
            per_state = {str(s): n for s, n in sorted(outcome.report.counts.items())}
            counts = ", ".join(f"{n} {s}" for s, n in per_state.items())
            out.note(
                f"shard {outcome.name} ended{tries}: {counts}",
                event="shard_ended",
                shard=outcome.name,
                attempts=outcome.attempts,
                counts=per_state,
            )
        else:
            from imggw_client.text import printable

            why = printable(str(outcome.error))
            out.warn(
                f"shard {outcome.name} failed{tries}: {why}",
                event="shard_failed",
                shard=outcome.name,
                attempts=outcome.attempts,
            )

    with sharded_display(out) as on_progress:
        report = anyio.run(
            lambda: arun_sharded(
                source,
                dest,
                address=modes.address,
                workers=modes.workers,
                client=client,
                rate_limit=flags.rate_limit,
                on_shard=on_shard,
                on_progress=on_progress,
                progress_every=PROGRESS_EVERY,
                **engine_options,
                **options,
            )
        )
    print_manifest(flags, dest, MANIFEST_NAME)
    if not out.quiet:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(report.merged.counts.items()))
        out.note(
            f"{len(report.shards)} shard(s) in {report.elapsed:.1f}s (engine ready in "
            f"{report.startup:.1f}s): {counts}",
            event="batch_summary",
            engine="dask",
            shards=len(report.shards),
            counts={str(s): n for s, n in sorted(report.merged.counts.items())},
            elapsed=round(report.elapsed, 1),
            comments=report.comments,
            exit_code=int(report.exit_code),
        )
        _changed(out, report.changed_lines)
    for failed in report.failed_shards:
        out.warn(
            f"shard {failed.name} kept failing; run the same command again to resume it",
            event="shard_failed",
            shard=failed.name,
        )
    _stopped(out, report.stopped_by, report.stop_reason)
    if report.exit_code == 3 and not report.failed_shards:
        out.note("some lines are unfinished: run the same command again to resume them")
    return report.exit_code


def print_manifest(flags: Globals, dest: str, rel: str) -> None:
    """The manifest ``rel`` (in the output folder) on stdout, a row a line, with --json; else
    where it is."""
    from imggw_client.batch import open_storage

    storage = open_storage(dest)
    if not flags.json:
        print(storage.where(rel), flush=True)
        return
    data = storage.read(rel) or b""
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            print(line, flush=True)


def merge_command(out: Output, flags: Globals, dest: str, title: str | None) -> int:
    from imggw_client.batch import MANIFEST_NAME, merge

    report = merge(dest, title=title)
    print_manifest(flags, dest, MANIFEST_NAME)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts.items()))
    out.note(
        f"merged {len(report.shards)} shard(s): {counts or 'no lines'}",
        event="merged",
        shards=len(report.shards),
        counts={str(s): n for s, n in sorted(report.counts.items())},
    )
    return report.exit_code


def status_command(out: Output, flags: Globals, dest: str) -> int:
    from imggw_client.batch import status

    st: RunStatus = status(dest)
    record = st.as_dict()
    ended = sum(1 for shard in st.shards if shard["ended"])
    line = f"{st.total} lines: " + ", ".join(f"{n} {state}" for state, n in st.counts.items())
    line += f", {st.expired} expired"
    if st.bad:
        line += f"; {st.bad} bad input line(s)"
    if st.shards:
        line += f"; shards: {ended} of {len(st.shards)} ended at least once"
    cost = "unknown" if st.spent.cost is None else f"{st.spent.cost:g}"
    lines = [line, f"spent: {st.spent.credits or 0:g} credits, cost {cost}"]
    held = {
        True: "yes: a run holds the folder now",
        False: "no run holds the folder now",
        None: "unknown (a remote folder)",
    }[st.active]
    lines.append(f"active: {held}")
    if st.soonest_expiry is not None:
        lines.append(
            f"soonest expiry of a result not saved yet: {st.soonest_expiry} "
            "(run the batch again before then)"
        )
    if st.stopped_by is not None:
        lines.append(f"stopped by: {st.stopped_by} (raise the limit, or top up, and run again)")
    resume = _next_run(dest, st)
    record["resume"] = resume
    if resume is not None:
        lines.append(f"resume: {resume}")
    out.data(record, lines)
    return st.exit_code


def _next_run(dest: str, st: RunStatus) -> str | None:
    """The command that goes on with a run that is not done (none while a run holds it: it
    goes on by itself); see _resume.batch_command."""
    if st.active or st.exit_code in (_exit.OK, _exit.TASK_FAILED):
        return None
    return _resume.batch_command(dest)
