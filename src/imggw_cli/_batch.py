"""``imggw batch`` (a run, one shard, a run on Dask) and its subcommands ``batch merge`` and
``batch status``. What runs beyond one process is in ``_scale``; the live display and the
summary in ``_batch_run``."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from . import _exit
from ._batch_run import BATCH_INTERRUPTED, ProgressEvery, progress_every, run_local
from ._command import (
    Concurrency,
    RunTimeout,
    SkipBadLines,
    interrupted,
    option,
    refuse,
    session,
)
from ._globals import LOCAL, current, with_globals, with_globals_of


class BatchGroup(TyperGroup):
    """``imggw batch``: the batch command itself, and its subcommands ``merge`` and ``status``.

    A Click group takes its own options, then a subcommand's name: it cannot also take a
    positional FILE. ``imggw batch FILE -o DEST`` came first and keeps its form, so this group
    decides by the first argument alone: a subcommand's name (``merge``, ``status``) runs that
    subcommand with the rest; anything else is the batch command's own FILE and options, parsed
    as a plain command's (options before or after FILE, nothing left over). A file named
    ``merge`` or ``status`` is given as ``./merge``.
    """

    # The batch command is parsed as a plain command is: options may follow FILE, nothing is
    # left over. super(TyperGroup, self) below is that plain Command (its parsing, usage and
    # invocation), skipping the group's, which would take what follows FILE for a subcommand.
    allow_extra_args = False
    allow_interspersed_args = True

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] in self.commands:
            ctx.args = args  # the subcommand and its arguments, for invoke
            return args
        result: list[str] = super(TyperGroup, self).parse_args(ctx, args)
        return result

    def invoke(self, ctx: Any) -> Any:
        if not ctx.args:
            return super(TyperGroup, self).invoke(ctx)
        name, *args = ctx.args
        ctx.args, ctx.invoked_subcommand = [], name
        command = self.commands[name]
        with command.make_context(name, args, parent=ctx) as sub_ctx:
            return command.invoke(sub_ctx)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces: list[str] = super(TyperGroup, self).collect_usage_pieces(ctx)
        return pieces  # `imggw batch [OPTIONS] FILE`: merge and status show their own usage

    def get_params(self, ctx: Any) -> list[Any]:
        # Click writes a parent's arguments into its children's usage (`imggw batch FILE
        # merge`): merge and status take no FILE, so theirs read `imggw batch merge`.
        if ctx.command is not self:
            return []
        params: list[Any] = super().get_params(ctx)
        return params


# Named where the root adds it (``batch``). merge and status are hidden from this help's
# command list: the batch command's help names them, as it always has.
app = typer.Typer(cls=BatchGroup, invoke_without_command=True)


class EngineChoice(str, Enum):
    dask = "dask"


SCALE = "Beyond one machine"
GUARDS = "Spend and failure guards"


# The options of `imggw batch` (Typer reads these annotations at run time).
LineTimeout = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--line-timeout",
        metavar="SECONDS",
        help="Wait at most this long on a line's task; one still running is left for the "
        "next run (exit 3) [default: 1800].",
    ),
]
AllowChanges = Annotated[
    bool,
    option(
        "--allow-changes",
        help="Run lines that changed since this folder's run began, as new (billed) requests.",
    ),
]
NameTemplate = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--name",
        metavar="TEMPLATE",
        help="Name result files by the plain fields {task_id}, {index}, {line} (the input line) "
        "and {id} (the line's id), e.g. '{line}-{id}' (no format spec such as {line:05}); made "
        "safe for any filesystem, the extension from the content; lines that would share a file "
        "are refused before anything is sent. The folder keeps it: a rerun without --name uses "
        "it, one with another is refused [default: {task_id}-{index}].",
    ),
]
Verify = Annotated[
    bool, option("--verify", help="Check every saved file's sha256 (default: its size).")
]
InputFormat = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--format",
        metavar="jsonl|csv|text",
        help="Read FILE as JSONL (a JSON object a line), CSV (a header row, then a record "
        "a row; comma- or tab-separated) or text (a prompt a line), whatever its name.",
    ),
]
NewRun = Annotated[
    bool,
    option(
        "--new-run",
        help="Start a new run (new keys: every line billed anew) in a folder that holds "
        "none. By default a folder made again resumes its run: the same keys, no new tasks.",
    ),
]
MaxCredits = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--max-credits",
        metavar="N",
        panel=GUARDS,
        help="Stop submitting before the folder's run is charged more than N credits in "
        "all (across reruns); lines sent are finished and saved, then exit 6.",
    ),
]
MaxCost = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--max-cost",
        metavar="X",
        panel=GUARDS,
        help="The same for the cost the gateway states.",
    ),
]
MaxFailures = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--max-failures",
        metavar="N",
        panel=GUARDS,
        help="Stop submitting once N lines failed in this run (exit 6).",
    ),
]
DryRun = Annotated[
    bool,
    option(
        "--dry-run",
        panel=GUARDS,
        help="Check everything a run checks, then say what it would do and cost: nothing "
        "is sent (--json: one object).",
    ),
]
Engine = Annotated[
    Optional[EngineChoice],  # noqa: UP045
    option(
        "--engine",
        panel=SCALE,
        help="Run the shards on Dask (pip install 'imggw[dask]').",
    ),
]
Address = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--address",
        metavar="tcp://HOST:PORT",
        panel=SCALE,
        help="A running Dask scheduler (with --engine dask).",
    ),
]
Workers = Annotated[
    Optional[int],  # noqa: UP045
    option(
        "--workers",
        min=1,
        metavar="N",
        panel=SCALE,
        help="Start (and stop) a local Dask cluster of N workers.",
    ),
]
ShardSize = Annotated[
    Optional[int],  # noqa: UP045
    option(
        "--shard-size",
        min=1,
        metavar="N",
        panel=SCALE,
        help="Input lines per shard on the engine [default: 1000].",
    ),
]
Shard = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--shard",
        metavar="I/N",
        panel=SCALE,
        help="Run only shard I of N, in this process (Kubernetes indexed jobs, "
        "Slurm arrays, xargs); any number at once on one DEST. Then: batch merge.",
    ),
]
Scratch = Annotated[
    Optional[Path],  # noqa: UP045
    option(
        "--scratch",
        metavar="DIR",
        panel=SCALE,
        help="Local folder where shards of a remote DEST keep their ledgers "
        "[default: the system's temp folder].",
    ),
]


def _limit(flag: str, text: Optional[str], *, whole: bool = False) -> Any:  # noqa: UP045
    """A limit from the command line: a number > 0 (a whole one for --max-failures), else
    exit 2 with one line saying so (Click's own message comes with a usage block)."""
    if text is None:
        return None
    import math

    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        from imggw_client.text import printable

        kind = "a whole number of lines >= 1" if whole else "a number > 0"
        refuse(f"{flag} must be {kind} (got {printable(text, 40)!r}); nothing was sent")
    return value


@app.callback(epilog=_exit.EPILOG)
@with_globals
def batch(
    file: Annotated[
        str,
        typer.Argument(
            help="JSONL (prompt, aspect_ratio, resolution, surface, id; or task_id to collect a "
            "task made elsewhere), CSV (a header row naming those columns) or text, a prompt a "
            "line (# and a space begins a comment); - reads standard input. Told by its name "
            "(.jsonl, .ndjson; .csv, .tsv), else line by line for .json and -, else text (see "
            "--format)."
        ),
    ],
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            metavar="DEST",
            help="Folder for images, ledger and manifest.jsonl; for shards also an fsspec URL "
            "(s3://bucket/prefix, memory://...).",
        ),
    ],
    concurrency: Concurrency = 8,
    timeout: RunTimeout = None,
    line_timeout: LineTimeout = None,
    skip_bad_lines: SkipBadLines = False,
    every: ProgressEvery = None,
    allow_changes: AllowChanges = False,
    name: NameTemplate = None,
    verify: Verify = False,
    input_format: InputFormat = None,
    new_run: NewRun = False,
    max_credits: MaxCredits = None,
    max_cost: MaxCost = None,
    max_failures: MaxFailures = None,
    dry_run: DryRun = False,
    engine: Engine = None,
    address: Address = None,
    workers: Workers = None,
    shard_size: ShardSize = None,
    shard: Shard = None,
    scratch: Scratch = None,
) -> None:
    """Generate every line of FILE exactly once, downloading each result as it is ready.

    Re-running the same command resumes: nothing is submitted twice, unfinished tasks are
    waited on, missing or damaged files are downloaded again; a folder deleted and made again
    sends the same keys, so the gateway replays the tasks it remembers (--new-run: new keys).
    An input that changed since the folder's run began, or another surface, is refused (exit
    2) unless --allow-changes. Writes manifest.jsonl and index.html (a gallery to open in a
    browser). Exit 0 if every line succeeded, 1 if some failed, 3 if some are unfinished.

    Beyond one machine: --engine dask runs shards of the input on a Dask cluster (one request
    budget for the whole run, held by the scheduler); --shard I/N runs one shard here. DEST may
    then be a URL. Also: imggw batch merge DEST (manifest.jsonl from the shards), imggw batch
    status DEST [--json] (progress, read from DEST alone).

    Example: imggw batch prompts.jsonl -o out/ --max-credits 500 --name '{line}-{id}'
    """
    from . import _scale

    modes = _scale.Modes(
        engine=engine.value if engine else None,
        address=address,
        workers=workers,
        shard=shard,
        shard_size=shard_size,
        scratch=None if scratch is None else str(scratch),
    )
    scaled = modes.any
    if input_format not in (None, "jsonl", "csv", "text"):
        from imggw_client.text import printable

        shown = printable(input_format, 40)
        refuse(f"--format must be jsonl, csv or text, not {shown!r}; nothing was sent")
    seconds = progress_every(every)  # checked here: a bad value is exit 2 before anything
    if new_run and (scaled or _is_remote(output)):
        refuse("--new-run is for one process into a local folder: give shards a new DEST")
    options: dict[str, Any] = {
        "concurrency": concurrency,
        "timeout": timeout,
        "skip_bad_lines": skip_bad_lines,
        "allow_changes": allow_changes,
        "verify": verify,
        "format": input_format,
        "max_credits": _limit("--max-credits", max_credits),
        "max_cost": _limit("--max-cost", max_cost),
        "max_failures": _limit("--max-failures", max_failures, whole=True),
    }
    name = _folder_name(output, name)
    if name is not None:  # checked here: a bad template is exit 2 before anything is read
        options["name"] = _template(name)
    if line_timeout is not None:  # else the SDK's default
        options["line_timeout"] = _limit("--line-timeout", line_timeout)
    if dry_run:
        if scaled or _is_remote(output):
            refuse("--dry-run plans one process into a local folder; nothing was sent")
        from ._dry_run import dry_run_local

        dry_run_local(file, _local(output), new_run=new_run, **options)
        return
    if not scaled and not _is_remote(output):
        run_local(file, _local(output), wait=True, new_run=new_run, every=seconds, **options)
        return
    flags = current()
    with session() as out:
        _scale.check_modes(out, flags, file, output, modes)
        try:
            code = _scale.run_scaled(out, flags, file, output, modes, options)
        except KeyboardInterrupt:
            interrupted(out, BATCH_INTERRUPTED)  # Ctrl-C, SIGTERM or SIGHUP: exits 130/143/129
    raise typer.Exit(code)


def _template(text: str) -> str:
    from imggw_client.batch import BatchOptions
    from imggw_client.text import printable

    try:
        BatchOptions(name=text)
    except ValueError as err:
        refuse(f"--name {printable(text, 60)!r} {getattr(err, 'rule', err)}; nothing was sent")
    return text


def _folder_name(dest: str, name: Optional[str]) -> Optional[str]:  # noqa: UP045
    """The template a run on ``dest`` names its files by: the one its run.json records when
    --name is not given (a resumed run keeps its names); another --name than the recorded one
    is refused, naming it (the run's files would be named two ways). A folder made before runs
    kept it, and a recorded template today's rules refuse, take --name as given."""
    from imggw_client.batch import BatchOptions
    from imggw_client.text import printable

    from ._resume import recorded_run

    recorded = recorded_run(dest).get("name")
    if recorded is None:
        return name
    try:
        BatchOptions(name=recorded)
    except ValueError:
        with session() as out:
            out.warn(
                f"this folder's recorded --name {printable(recorded, 60)!r} is not a "
                "template any more: files already saved keep their names, new ones get "
                + ("--name's" if name is not None else "the default ones"),
                event="recorded_name_refused",
            )
        return name
    if name is None or name == recorded:
        return recorded
    refuse(
        f"--name {printable(name, 60)!r}: this folder's run names its files by "
        f"--name {printable(recorded, 60)!r}; run without --name to go on with it, or use "
        "another folder; nothing was sent"
    )


def _is_remote(dest: str) -> bool:
    from imggw_client.batch import is_url

    return is_url(dest)


def _local(dest: str) -> Path:
    from imggw_client.batch import open_storage

    if not dest.strip():  # an unset shell variable: never the current folder
        raise typer.BadParameter("the output folder is empty: name a folder", param_hint="DEST")
    local = open_storage(dest).local
    assert local is not None  # only asked of a local DEST
    return local


Dest = Annotated[
    str, typer.Argument(metavar="DEST", help="A batch's output folder (a path or an fsspec URL).")
]


@app.command("merge", hidden=True, epilog=_exit.EPILOG)
@with_globals_of(*LOCAL)
def merge(
    dest: Dest,
    title: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--title", help="The gallery's title [default: the folder's name]."),
    ] = None,
) -> None:
    """Write DEST/manifest.jsonl from the shards' manifests (one row per input line, in line
    order; lines no shard reached yet are pending), and the gallery DEST/index.html. Exit codes
    as imggw batch.

    Example: imggw batch merge s3://bucket/run-7
    """
    from . import _scale

    with session() as out:
        code = _scale.merge_command(out, current(), dest, title)
    raise typer.Exit(code)


@app.command("status", hidden=True, epilog=_exit.EPILOG)
@with_globals_of(*LOCAL)
def status(dest: Dest) -> None:
    """Print a batch's progress, read from DEST alone (a single run's or a sharded one's):
    lines per state (pending, running, succeeded, failed; expired apart), whether a run holds
    the folder now, the soonest link expiry among results not saved yet, and the command that
    resumes. --json prints one object (total, counts, expired, active, soonest_expiry, resume,
    ...). Exit 0 if every line succeeded, 1 if some failed or expired, 3 if some are unfinished.

    Example: imggw batch status out/ --json
    """
    from . import _scale

    with session() as out:
        code = _scale.status_command(out, current(), dest)
    raise typer.Exit(code)
