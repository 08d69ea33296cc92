"""The commands on one task: ``generate``, ``submit``, ``status``, ``poll`` (and ``wait``)."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional, cast

import typer

from imggw_client import rules

from . import _exit
from ._command import (
    RESULT_ROOM,
    OutputDir,
    Overwrite,
    Tracked,
    ready_folder,
    resolve_prompt,
    session,
)
from ._globals import current, with_globals
from ._output import submission_record, task_lines, task_record
from ._runtime import journaled_surfaces, make_client
from ._when import iso_utc, links_expire

if TYPE_CHECKING:
    import imggw_client
    from imggw_client import Client, Submission

app = typer.Typer()

# Choices come from the request rules, so --help lists exactly what the gateway accepts.
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
    typer.Option(
        "--resolution", "-r", case_sensitive=False, help=f"Resolution ({rules.COMBINATIONS_TEXT})."
    ),
]
Timeout = Annotated[
    float,
    typer.Option("--timeout", "-t", min=0, help="Seconds to wait; the task goes on after it."),
]
IdempotencyKey = Annotated[
    Optional[str],  # noqa: UP045 - Typer wants this spelling on Python 3.10
    typer.Option("--idempotency-key", help="Reuse an earlier submit's key: a safe retry."),
]


def _submit(
    client: "Client",
    tracked: Tracked,
    prompt: str,
    aspect_ratio: str,
    resolution: str,
    key: Optional[str],  # noqa: UP045
) -> "Submission":
    """The submit of ``generate`` and ``submit``: its key made before it goes (so that Ctrl-C
    can name it), and its task tracked once known."""
    sent = tracked.submitting(key, aspect_ratio, resolution)
    # Typer's choices hold them to the rules' values: the SDK's Literal types, as text.
    sub = client.submit(
        prompt,
        aspect_ratio=cast("imggw_client.AspectRatio", aspect_ratio),
        resolution=cast("imggw_client.Resolution", resolution),
        idempotency_key=sent,
    )
    tracked.id = sub.task_id
    return sub


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
    """Submit, wait with a progress bar, download; print the saved paths.

    Example: imggw generate "a lighthouse at dusk" -a 16:9 -r 2k -o out/
    """
    tracked = Tracked(command="generate", output=output)
    with session(tracked) as out:
        prompt = resolve_prompt(prompt, out)
        # Before the submit: a task is paid for once sent, and rerunning generate pays again.
        ready_folder(output, out, room=RESULT_ROOM[resolution.value])
        # One imggw.generate span, its download included (DESIGN 17), when telemetry records.
        with make_client(current(), journal=True) as client, client.generation():
            sub = _submit(
                client, tracked, prompt, aspect_ratio.value, resolution.value, idempotency_key
            )
            with out.progress(sub.task_id) as on_update:
                task = client.wait(sub, wait_timeout=timeout, on_update=on_update)
            # An absolute folder: the journal keeps where the files are, wherever the next
            # command is run from (imggw tasks lists them).
            files = client.download(task, output.absolute(), overwrite=overwrite)
        if task.expires_at is not None:
            out.note(
                links_expire(task.expires_at),
                event="links_expire",
                task_id=task.id,
                expires_at=iso_utc(task.expires_at),
            )
        out.data(task_record(task, files), [str(f.path) for f in files])


@app.command(epilog=_exit.EPILOG)
@with_globals
def submit(
    prompt: Prompt,
    aspect_ratio: AspectRatio = AUTO,
    resolution: Resolution = ONE_K,
    idempotency_key: IdempotencyKey = None,
) -> None:
    """Submit one request; print its task id, idempotency key and surface (-q: the task id
    alone, for id=$(imggw submit -q ...)).

    Example: imggw submit "a red fox in snow" -a 3:2 --json
    """
    tracked = Tracked()
    with session(tracked) as out:
        prompt = resolve_prompt(prompt, out)
        with make_client(current(), journal=True) as client:
            sub = _submit(
                client, tracked, prompt, aspect_ratio.value, resolution.value, idempotency_key
            )
        record = submission_record(sub)
        # -q says no more than a script needs (as docker run -q): the id, which the journal
        # keeps with its key (imggw tasks).
        lines = [sub.task_id] if out.quiet else [f"{k}: {v}" for k, v in record.items()]
        out.data(record, lines)


@app.command(epilog=_exit.EPILOG)
@with_globals
def status(task_id: TaskId) -> None:
    """Query a task once (on the surface the journal recorded it on, unless one is chosen).

    Example: imggw status 123 --surface alpha
    """
    tracked = Tracked(command="status")
    with session(tracked) as out, make_client(current(), journal=True) as client:
        tracked.surface = journaled_surfaces(client, current(), [task_id]).get(task_id)
        task = client.get(task_id, surface=tracked.surface)
        out.data(task_record(task), task_lines(task))


def _poll(task_id: str, timeout: float) -> None:
    tracked = Tracked(task_id)
    with session(tracked) as out, make_client(current(), journal=True) as client:
        tracked.surface = journaled_surfaces(client, current(), [task_id]).get(task_id)
        with out.progress(task_id) as on_update:
            task = client.wait(
                task_id, surface=tracked.surface, wait_timeout=timeout, on_update=on_update
            )
        out.data(task_record(task), task_lines(task))


@app.command(epilog=_exit.EPILOG)
@with_globals
def poll(task_id: TaskId, timeout: Timeout = 600.0) -> None:
    """Wait until the task finishes, with a progress bar. On timeout: exit 3, resume later.

    Example: imggw poll 123 --timeout 900
    """
    _poll(task_id, timeout)


@app.command("wait", epilog=_exit.EPILOG)
@with_globals
def wait_(task_id: TaskId, timeout: Timeout = 600.0) -> None:
    """The same as poll.

    Example: imggw wait 123
    """
    _poll(task_id, timeout)
