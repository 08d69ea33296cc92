"""The ``imggw`` commands. Each is a thin shell over the SDK: options in, SDK call, output out.

Heavy modules (httpx, pydantic, rich, the SDK's clients) are imported inside the commands, so
that ``imggw --help`` and ``imggw --version`` start as fast as a bare Typer app.
"""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from imggw_client._core import rules
from imggw_client._version import __version__

from . import _exit
from ._globals import current, with_globals
from ._output import Output, submission_record, task_lines, task_record, unfinished_record
from ._runtime import make_async_client, make_client, setup_logging
from ._when import links_expire

BATCH_SUBCOMMANDS = ("merge", "status")


class _Root(TyperGroup):
    """The root group: ``imggw batch merge DEST`` and ``imggw batch status DEST`` go to their own
    commands, while ``imggw batch FILE -o DEST`` stays the batch command it always was (its
    first argument is the input file). A file named ``merge`` or ``status`` is ``./merge``."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[Any, Any, list[str]]:
        if len(args) >= 2 and args[0] == "batch" and args[1] in BATCH_SUBCOMMANDS:
            name = f"batch {args[1]}"
            return name, self.commands[name], args[2:]
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=_Root,
    name="imggw",
    help="Generate images through an imggw gateway: submit, wait, download, safely.",
    epilog=_exit.EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
mock_app = typer.Typer(help="The bundled reference gateway.", no_args_is_help=True)
app.add_typer(mock_app, name="mock")

# Choices come from the core's rules, so --help lists exactly what the gateway accepts.
AspectRatioChoice = Enum(  # type: ignore[misc]
    "AspectRatioChoice", [(r, r) for r in rules.ASPECT_RATIOS], type=str
)
ResolutionChoice = Enum("ResolutionChoice", [(r, r) for r in rules.RESOLUTIONS], type=str)  # type: ignore[misc]
AUTO, ONE_K = AspectRatioChoice("auto"), ResolutionChoice("1k")

Prompt = Annotated[
    str, typer.Argument(help="What to draw (1 to 20000 characters); - reads it from stdin.")
]
TaskId = Annotated[str, typer.Argument(help="A task id, as submit printed it.")]
AspectRatio = Annotated[
    AspectRatioChoice, typer.Option("--aspect-ratio", "-a", help="Aspect ratio.")
]
Resolution = Annotated[
    ResolutionChoice,
    typer.Option("--resolution", "-r", case_sensitive=False,
                 help=f"Resolution ({rules.COMBINATIONS_TEXT})."),
]  # fmt: skip
Timeout = Annotated[
    float,
    typer.Option("--timeout", "-t", min=0, help="Seconds to wait; the task goes on after it."),
]
IdempotencyKey = Annotated[
    Optional[str],  # noqa: UP045 - Typer wants this spelling on Python 3.10
    typer.Option("--idempotency-key", help="Reuse an earlier submit's key: a safe retry."),
]
OutputDir = Annotated[Path, typer.Option("--output", "-o", help="Folder for the images.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace files that exist.")]


def _version(value: bool) -> None:
    if value:
        print(f"imggw {__version__}")
        raise typer.Exit()


@app.callback()
@with_globals
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Generate images through an imggw gateway: submit, wait, download, safely.

    The API key is read from IMGGW_API_KEY only. Global options may come before or after
    the command name.
    """


class Tracked:
    """What a command works on, once known, for its error and Ctrl-C messages: the submit under
    way (its key and request), then its task, and the folder its results go to."""

    def __init__(
        self,
        task_id: Optional[str] = None,  # noqa: UP045
        command: str = "submit",
        output: Optional[Path] = None,  # noqa: UP045
    ) -> None:
        self.id = task_id
        self.command = command
        self.output = output  # set for commands that save results (generate, download)
        self.key: Optional[str] = None  # noqa: UP045
        self.request: tuple[str, str] = ("auto", "1k")

    def submitting(self, key: Optional[str], aspect_ratio: str, resolution: str) -> str:  # noqa: UP045
        """The key the submit sends (the caller's, else a fresh one made here, so that an
        interrupted submit can be sent again safely)."""
        from imggw_client._core.flows import new_idempotency_key

        self.key = key or new_idempotency_key()
        self.request = (aspect_ratio, resolution)
        return self.key

    def resume(self, surface: str) -> str:
        """The command that picks the task up: one that also saves its results when this one
        was to save them (``poll`` only waits), so that nothing is submitted, or paid, again."""
        if self.output is not None:
            folder = shlex.quote(str(self.output))
            return f"imggw download {self.id} --wait --surface {surface} -o {folder}"
        return f"imggw poll {self.id} --surface {surface}"


@contextmanager
def _session(tracked: Optional[Tracked] = None) -> Iterator[Output]:  # noqa: UP045
    """Output for a command, and every error turned into one line and an exit code. With
    --json, a task that failed or is still running at the timeout is printed too (stdout), so
    that a script always has a record to read beside the exit code."""
    from imggw_client import DownloadError, ImggwError, TaskFailedError, WaitTimeoutError
    from imggw_client._download import FILE_EXISTS

    options = current()
    setup_logging(options)
    out = Output(options)
    surface = options.chosen_surface
    try:
        yield out
    except ImggwError as err:
        if options.verbose:
            import traceback

            traceback.print_exception(err, file=sys.stderr)
        import os

        if out.json and isinstance(err, TaskFailedError):
            out.data(task_record(err.task), [])
        elif out.json and isinstance(err, WaitTimeoutError):
            out.data(unfinished_record(err.task_id, err.last_task), [])
        base_url = options.base_url or os.environ.get("IMGGW_BASE_URL")
        resume = tracked.resume(surface) if tracked is not None and tracked.id else None
        message = _exit.message_for(
            err, surface=surface, mock=options.mock, base_url=base_url, resume=resume
        )
        if (
            isinstance(err, DownloadError)
            and tracked is not None
            and tracked.command == "generate"  # imggw download itself failed: no hint
            and tracked.id is not None
        ):
            # The task is done and paid for: its results are still to be had, without
            # running generate again (which would pay for a new task).
            command = f"imggw download {tracked.id} --surface {surface}"
            if err.code == FILE_EXISTS or tracked.output is None:
                command += " -o DIR (another folder, or add --overwrite)"
            else:
                command += f" -o {shlex.quote(str(tracked.output))}"
            message += f"\n  the task succeeded and is paid for; save its results with: {command}"
        out.error(message)
        raise typer.Exit(_exit.code_for(err)) from None
    except KeyboardInterrupt:
        if tracked is not None and tracked.id is not None:
            resume = tracked.resume(surface)
            out.error(f"interrupted; task {tracked.id} goes on. Resume with: {resume}")
        elif tracked is not None and tracked.key is not None:
            hint = _exit.resubmit_hint(tracked.command, surface, *tracked.request, tracked.key)
            out.error(f"interrupted during the submit: a task may have been created.\n{hint}")
        else:
            out.error("interrupted")
        raise typer.Exit(_exit.INTERRUPTED) from None


STDIN = "-"
BATCH_INTERRUPTED = "interrupted; every line's progress is saved: run the same command to resume"


# The room a result of each resolution may plausibly need: a 1k PNG is about 1 to 3 MB and a
# 4K one up to a few tens of MB. A folder with less free space would take the task's money and
# then fail to save its image.
RESULT_ROOM = {"1k": 4 << 20, "2k": 16 << 20, "4k": 64 << 20}


def _ready_folder(folder: Path, out: Output, *, room: int = 0) -> None:
    """The output folder, made if missing, checked writable and with ``room`` bytes free,
    before anything is paid for."""
    import os
    import shutil

    if folder.exists() and not folder.is_dir():
        out.error(f"-o {folder}: a file is there, not a folder; nothing was sent")
        raise typer.Exit(_exit.USAGE)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        out.error(f"cannot create {folder}: {exc.strerror}; nothing was sent")
        raise typer.Exit(_exit.AUTH_OR_CONFIG) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        out.error(f"cannot write in {folder}: permission denied; nothing was sent")
        raise typer.Exit(_exit.AUTH_OR_CONFIG)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # a filesystem that cannot tell: the download still checks every write
        return
    if free < room:
        out.error(
            f"{folder} has {free / (1 << 20):.1f} MiB free; a result may need about "
            f"{room >> 20} MiB: make room, then run the same command (nothing was sent)"
        )
        raise typer.Exit(_exit.AUTH_OR_CONFIG)


def _resolve_prompt(prompt: str, out: Output) -> str:
    """The prompt; with ``-``, all of standard input less one trailing newline (so that
    ``echo "a cat" | imggw submit -`` submits ``a cat``). A prompt read there that breaks a
    rule stops the command before anything is sent."""
    if prompt != STDIN:
        return prompt
    if sys.stdin.isatty():
        out.note("reading the prompt from standard input; end it with Ctrl-D")
    buffer = getattr(sys.stdin, "buffer", None)
    try:  # bytes, decoded here: the terminal's encoding has no say in what the prompt is
        text = sys.stdin.read() if buffer is None else buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        out.error(f"cannot read standard input: not UTF-8 text ({exc.reason})")
        raise typer.Exit(_exit.USAGE) from None
    text = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")
    for violation in rules.check_prompt(text):
        out.error(f"the prompt read from standard input {violation.rule}")
        raise typer.Exit(_exit.USAGE)
    return text


@app.command(epilog=_exit.EPILOG)
@with_globals
def generate(
    prompt: Prompt,
    aspect_ratio: AspectRatio = AUTO,
    resolution: Resolution = ONE_K,
    timeout: Timeout = 600.0,
    output: OutputDir = Path("."),
    overwrite: Overwrite = False,
    idempotency_key: IdempotencyKey = None,
) -> None:
    """Submit, wait with a progress bar, download; print the saved paths."""
    tracked = Tracked(command="generate", output=output)
    with _session(tracked) as out:
        prompt = _resolve_prompt(prompt, out)
        # Before the submit: a task is paid for once sent, and rerunning generate pays again.
        _ready_folder(output, out, room=RESULT_ROOM[resolution.value])
        key = tracked.submitting(idempotency_key, aspect_ratio.value, resolution.value)
        with make_client(current()) as client:
            sub = client.submit(
                prompt, aspect_ratio=aspect_ratio.value, resolution=resolution.value,
                idempotency_key=key,
            )  # fmt: skip
            tracked.id = sub.task_id
            with out.progress(sub.task_id) as on_update:
                task = client.wait(sub, timeout=timeout, on_update=on_update)
            files = client.download(task, output, overwrite=overwrite)
        if task.expires_at is not None:
            out.note(links_expire(task.expires_at))
        out.data(task_record(task, files), [str(f.path) for f in files])


@app.command(epilog=_exit.EPILOG)
@with_globals
def submit(
    prompt: Prompt,
    aspect_ratio: AspectRatio = AUTO,
    resolution: Resolution = ONE_K,
    idempotency_key: IdempotencyKey = None,
) -> None:
    """Submit one request; print its task id and idempotency key."""
    tracked = Tracked()
    with _session(tracked) as out:
        prompt = _resolve_prompt(prompt, out)
        key = tracked.submitting(idempotency_key, aspect_ratio.value, resolution.value)
        with make_client(current()) as client:
            sub = client.submit(
                prompt, aspect_ratio=aspect_ratio.value, resolution=resolution.value,
                idempotency_key=key,
            )  # fmt: skip
            tracked.id = sub.task_id
        record = submission_record(sub)
        out.data(record, [f"{name}: {value}" for name, value in record.items()])


@app.command(epilog=_exit.EPILOG)
@with_globals
def status(task_id: TaskId) -> None:
    """Query a task once."""
    with _session() as out, make_client(current()) as client:
        task = client.get(task_id)
        out.data(task_record(task), task_lines(task))


def _poll(task_id: str, timeout: float) -> None:
    with _session(Tracked(task_id)) as out, make_client(current()) as client:
        with out.progress(task_id) as on_update:
            task = client.wait(task_id, timeout=timeout, on_update=on_update)
        out.data(task_record(task), task_lines(task))


@app.command(epilog=_exit.EPILOG)
@with_globals
def poll(task_id: TaskId, timeout: Timeout = 600.0) -> None:
    """Wait until the task finishes, with a progress bar. On timeout: exit 3, resume later."""
    _poll(task_id, timeout)


@app.command("wait", epilog=_exit.EPILOG)
@with_globals
def wait_(task_id: TaskId, timeout: Timeout = 600.0) -> None:
    """The same as poll."""
    _poll(task_id, timeout)


Concurrency = Annotated[
    int, typer.Option("--concurrency", "-c", min=1, help="Submits (and downloads) at once.")
]
RunTimeout = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--timeout", "-t", min=0, help="Stop after this many seconds; run again to resume."
    ),
]
SkipBadLines = Annotated[
    bool, typer.Option("--skip-bad-lines", help="Report bad lines and go on (default: stop).")
]


@app.command(epilog=_exit.EPILOG)
@with_globals
def download(
    task_ids: Annotated[
        Optional[list[str]],  # noqa: UP045
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
            "Keeps a ledger and manifest.jsonl in --output; rerun to resume.",
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for unfinished tasks (default: report them).")
    ] = False,
    timeout: RunTimeout = None,
    concurrency: Concurrency = 8,
    skip_bad_lines: SkipBadLines = False,
) -> None:
    """Download the results of finished tasks; print the saved paths.

    Without --wait, unfinished tasks are reported (exit 3) and the rest saved. With --from,
    results are saved the soonest-expiring first, a dead link is asked again for a fresh one,
    and the run resumes where it stopped (exit codes as imggw batch).
    """
    if (source is None) == (not task_ids):
        with _session() as out:
            out.error("give task ids, or --from FILE (one of them)")
        raise typer.Exit(_exit.USAGE)
    if source is not None:
        _run_batch(source, output, collect=True, wait=wait, timeout=timeout,
                   concurrency=concurrency, skip_bad_lines=skip_bad_lines)  # fmt: skip
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
    from imggw_client._core.text import printable

    codes: list[int] = []
    with _session(), make_client(current()) as client:
        for task_id in task_ids:
            code = _exit.OK
            try:
                with _session(Tracked(task_id, "download", output)) as out:
                    if wait:
                        with out.progress(task_id) as on_update:
                            try:
                                task = client.wait(
                                    task_id,
                                    timeout=600.0 if timeout is None else timeout,
                                    on_update=on_update,
                                )
                            except TaskFailedError as failed:  # reported below, like the rest
                                task = failed.task
                    else:
                        task = client.get(task_id)
                    if not task.is_terminal:
                        raise WaitTimeoutError(task_id, task, timeout=0)
                    if task.status is TaskStatus.SUCCEEDED:
                        files = client.download(task, output, overwrite=overwrite)
                    else:
                        files = []
                        reason = printable(task.error.message) if task.error else ""
                        out.error(f"task {task_id} failed: {reason}")
                        code = _exit.TASK_FAILED
                    out.data(task_record(task, files), [str(f.path) for f in files])
            except typer.Exit as failed:
                if failed.exit_code == _exit.INTERRUPTED:
                    raise
                code = int(failed.exit_code)
            codes.append(code)
    worst = _exit.download_code(codes)
    if worst:
        raise typer.Exit(worst)


class EngineChoice(str, Enum):
    dask = "dask"


SCALE = "Beyond one machine"


@app.command(epilog=_exit.EPILOG)
@with_globals
def batch(
    file: Annotated[
        str,
        typer.Argument(
            help="JSONL (prompt, aspect_ratio, resolution, id; or task_id to collect a task made "
            "elsewhere) or text, a prompt a line; - reads standard input. Told by its name "
            "(.jsonl, .ndjson), else line by line for .json and -, else text (see --format)."
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
    skip_bad_lines: SkipBadLines = False,
    allow_changes: Annotated[
        bool,
        typer.Option(
            "--allow-changes",
            help="Run lines that changed since this folder's run began, as new (billed) requests.",
        ),
    ] = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Check every saved file's sha256 (default: its size).")
    ] = False,
    input_format: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--format",
            metavar="jsonl|text",
            help="Read FILE as JSONL (a JSON object a line) or as text (a prompt a line), "
            "whatever its name.",
        ),
    ] = None,
    new_run: Annotated[
        bool,
        typer.Option(
            "--new-run",
            help="Start a new run (new keys: every line billed anew) in a folder that holds "
            "none. By default a folder made again resumes its run: the same keys, no new tasks.",
        ),
    ] = False,
    engine: Annotated[
        Optional[EngineChoice],  # noqa: UP045
        typer.Option(
            "--engine",
            help="Run the shards on Dask (pip install 'imggw[dask]').",
            rich_help_panel=SCALE,
        ),
    ] = None,
    address: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--address",
            metavar="tcp://HOST:PORT",
            rich_help_panel=SCALE,
            help="A running Dask scheduler (with --engine dask).",
        ),
    ] = None,
    workers: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--workers",
            min=1,
            metavar="N",
            rich_help_panel=SCALE,
            help="Start (and stop) a local Dask cluster of N workers.",
        ),
    ] = None,
    shard_size: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--shard-size",
            min=1,
            metavar="N",
            rich_help_panel=SCALE,
            help="Input lines per shard on the engine [default: 1000].",
        ),
    ] = None,
    shard: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--shard",
            metavar="I/N",
            rich_help_panel=SCALE,
            help="Run only shard I of N, in this process (Kubernetes indexed jobs, "
            "Slurm arrays, xargs); any number at once on one DEST. Then: batch merge.",
        ),
    ] = None,
    scratch: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--scratch",
            metavar="DIR",
            rich_help_panel=SCALE,
            help="Local folder where shards of a remote DEST keep their ledgers "
            "[default: the system's temp folder].",
        ),
    ] = None,
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
    """
    scale_options = (engine, shard, address, workers, shard_size, scratch)
    scaled = any(option is not None for option in scale_options)
    refused = None
    if input_format not in (None, "jsonl", "text"):
        refused = f"--format must be jsonl or text, not {input_format!r}; nothing was sent"
    elif new_run and (scaled or _is_remote(output)):
        refused = "--new-run is for one process into a local folder: give shards a new DEST"
    elif input_format is not None and engine is not None:
        refused = "--format is not taken with --engine: name the input .jsonl or .txt instead"
    if refused is not None:
        with _session() as out:
            out.error(refused)
        raise typer.Exit(_exit.USAGE)
    if not scaled and not _is_remote(output):
        _run_batch(
            file, _local(output), collect=False, wait=True, timeout=timeout,
            concurrency=concurrency, skip_bad_lines=skip_bad_lines, allow_changes=allow_changes,
            verify=verify, format=input_format, new_run=new_run,
        )  # fmt: skip
        return
    from . import _scale

    flags = current()
    options: dict[str, Any] = {
        "concurrency": concurrency, "timeout": timeout, "skip_bad_lines": skip_bad_lines,
        "allow_changes": allow_changes, "verify": verify,
        "scratch": None if scratch is None else str(scratch),
    }  # fmt: skip
    if input_format is not None:  # one shard in this process: its spec takes it
        options["format"] = input_format
    with _session() as out:
        _scale.check_modes(
            out, flags, source=file, dest=output, engine=engine.value if engine else None,
            address=address, workers=workers, shard=shard, shard_size=shard_size,
            scratch=scratch,
        )  # fmt: skip
        try:
            if engine is not None:
                code = _scale.run_engine(
                    out, flags, file, output, address=address, workers=workers,
                    shard_size=shard_size, options=options,
                )  # fmt: skip
            else:
                from imggw_client.batch import MANIFEST_NAME, merge, parse_shard
                from imggw_client.batch._shards import SHARDS_DIR, shard_name

                index, count = parse_shard(shard) if shard is not None else (1, 1)
                report = _scale.run_shard(
                    out, flags, file, output, index=index, count=count,
                    options={**options, "surface": flags.surface},
                )  # fmt: skip
                code = report.exit_code
                if shard is None:  # one process into a remote folder: the merge is ours to do
                    code = merge(output).exit_code
                    _scale.print_manifest(flags, output, MANIFEST_NAME)
                else:
                    manifest = f"{SHARDS_DIR}/{shard_name(index, count)}/{MANIFEST_NAME}"
                    _scale.print_manifest(flags, output, manifest)
                    _scale.shard_summary(out, report, f"{output.rstrip('/')}/{manifest}")
        except KeyboardInterrupt:
            out.error(BATCH_INTERRUPTED)
            raise typer.Exit(_exit.INTERRUPTED) from None
    raise typer.Exit(code)


def _is_remote(dest: str) -> bool:
    from imggw_client.batch._storage import is_url

    return is_url(dest)


def _local(dest: str) -> Path:
    from imggw_client.batch._storage import local_path

    return local_path(dest)


Dest = Annotated[
    str, typer.Argument(metavar="DEST", help="A batch's output folder (a path or an fsspec URL).")
]


@app.command("batch merge", hidden=True, epilog=_exit.EPILOG)
@with_globals
def batch_merge(
    dest: Dest,
    title: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--title", help="The gallery's title [default: the folder's name]."),
    ] = None,
) -> None:
    """Write DEST/manifest.jsonl from the shards' manifests (one row per input line, in line
    order; lines no shard reached yet are pending), and the gallery DEST/index.html. Exit codes
    as imggw batch."""
    from . import _scale

    with _session() as out:
        code = _scale.merge_command(out, current(), dest, title)
    raise typer.Exit(code)


@app.command("batch status", hidden=True, epilog=_exit.EPILOG)
@with_globals
def batch_status(dest: Dest) -> None:
    """Print a batch's progress, read from DEST alone (a single run's or a sharded one's):
    lines per state (pending, running, succeeded, failed). --json prints one object with total
    and counts. Exit 0 if every line succeeded, 1 if some failed, 3 if some are unfinished."""
    from . import _scale

    with _session() as out:
        code = _scale.status_command(out, current(), dest)
    raise typer.Exit(code)


def _run_batch(source: str, output: Path, **options: Any) -> None:
    """A batch (or a collect), its live display, the manifest on stdout, the summary."""
    import anyio

    from imggw_client.batch import arun_batch

    from ._batch_display import batch_display, batch_summary

    flags = current()
    with _session() as out:

        async def main() -> Any:
            async with make_async_client(flags) as client:
                with batch_display(out) as on_progress:
                    return await arun_batch(source, output, client=client,
                                            on_progress=on_progress, **options)  # fmt: skip

        try:
            report = anyio.run(main)
        except KeyboardInterrupt:
            out.error(BATCH_INTERRUPTED)
            raise typer.Exit(_exit.INTERRUPTED) from None
        if flags.json:
            with report.manifest.open(encoding="utf-8") as manifest:
                for line in manifest:
                    print(line.rstrip("\n"), flush=True)
        else:
            print(report.manifest, flush=True)
        batch_summary(out, report)
    raise typer.Exit(report.exit_code)


@app.command(epilog=_exit.EPILOG)
@with_globals
def gallery(
    folder: Annotated[Path, typer.Argument(help="A batch's output folder (with manifest.jsonl).")],
    title: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--title", help="The page's title [default: the folder's name]."),
    ] = None,
) -> None:
    """Write FOLDER/index.html, a contact sheet of the results, from FOLDER/manifest.jsonl;
    print its path. Open it in a browser: it needs no network."""
    from imggw_client.batch import MANIFEST_NAME, iter_manifest, write_gallery

    with _session() as out:
        manifest = folder / MANIFEST_NAME
        if not manifest.is_file():
            out.error(f"{manifest} not found: give a batch's output folder (imggw batch -o)")
            raise typer.Exit(_exit.USAGE)
        try:
            page = write_gallery(folder, iter_manifest(manifest), title=title or folder.name)
        except ValueError as exc:
            out.error(f"{manifest}: {exc}")
            raise typer.Exit(_exit.USAGE) from None
        except OSError as exc:
            out.error(f"cannot write the gallery in {folder}: {exc.strerror or exc}")
            raise typer.Exit(_exit.AUTH_OR_CONFIG) from None
        out.data({"path": str(page)}, [str(page)])


@mock_app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                      "help_option_names": []},
    add_help_option=False,
)  # fmt: skip
def mock_serve(ctx: typer.Context) -> None:
    """Serve the reference gateway over HTTP (every gateway option; see --help)."""
    from imggw_client.mock.__main__ import main as serve_main

    raise typer.Exit(serve_main(ctx.args, prog="imggw mock serve"))


def run() -> None:
    """The entry point: Typer in standalone mode (usage errors exit 2); commands set their own
    exit codes, Ctrl-C included."""
    app(prog_name="imggw")
