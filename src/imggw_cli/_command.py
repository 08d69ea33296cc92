"""What every command shares: the session that turns any error into one line on stderr and an
exit code, what a command tracks for its error and Ctrl-C messages, the checks made before
anything is paid for (the output folder, a prompt read from stdin), and the options that
several commands take alike.

SIGTERM and SIGHUP end a command as Ctrl-C does (DESIGN 18): systemd, Kubernetes and
``timeout`` stop a process with SIGTERM, a closed terminal or a dropped ssh session sends SIGHUP,
and either deserves what Ctrl-C gets: the resume hint, the ``interrupted`` event, a batch's
manifest written; the exit code says which signal it was (128 + its number: 143, 129; 130 for
Ctrl-C). Nothing here decides how a command stops: the signal is handed to whatever handles
SIGINT at that moment. That is Python's own handler (``KeyboardInterrupt``) in a blocking
command, and the event loop's in a batch (it cancels the run's main task, so the run winds down
and writes its manifest as on Ctrl-C, then raises ``KeyboardInterrupt``).
"""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer

from imggw_client import rules

from . import _exit, _output
from ._globals import Globals, current
from ._output import Output, task_record, unfinished_record
from ._resume import resend_command, save_command, wait_command
from ._runtime import setup_logging

if TYPE_CHECKING:
    from imggw_client import Surface

OutputDir = Annotated[Path, typer.Option("--output", "-o", help="Folder for the images.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace files that exist.")]
Concurrency = Annotated[
    int, typer.Option("--concurrency", "-c", min=1, help="Submits (and downloads) at once.")
]
RunTimeout = Annotated[
    Optional[float],  # noqa: UP045 - Typer wants this spelling on Python 3.10
    typer.Option(
        "--timeout", "-t", min=0, help="Stop after this many seconds; run again to resume."
    ),
]
SkipBadLines = Annotated[
    bool, typer.Option("--skip-bad-lines", help="Report bad lines and go on (default: stop).")
]


def option(
    *names: str,
    help: str,
    metavar: str | None = None,
    panel: str | None = None,
    **more: Any,
) -> Any:
    """A command's option as Typer declares it, in one call: its flags, help, metavar and the
    help panel it shows in (``more``: the rest of ``typer.Option``'s keywords).
    """
    return typer.Option(*names, metavar=metavar, rich_help_panel=panel, help=help, **more)


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
        # The task's surface when the command found it (in the journal), else the options'.
        self.surface: Optional[Surface] = None  # noqa: UP045
        self.key: Optional[str] = None  # noqa: UP045
        self.request: tuple[str, str] = ("auto", "1k")
        # How the command ended, when an error ended it (set by session): a command of several
        # tasks exits by the conditions its tasks met (_exit.several).
        self.condition: Optional[_exit.Condition] = None  # noqa: UP045

    def submitting(self, key: Optional[str], aspect_ratio: str, resolution: str) -> str:  # noqa: UP045
        """The key the submit sends (the caller's, else a fresh one made here, so that an
        interrupted submit can be sent again safely)."""
        from imggw_client import new_idempotency_key

        self.key = new_idempotency_key() if key is None else key  # "" is refused, never replaced
        self.request = (aspect_ratio, resolution)
        return self.key

    def resume(self, surface: str, options: Globals) -> str:
        """The command that picks the task up (see _resume.wait_command)."""
        assert self.id is not None
        return wait_command(self.id, surface, self.output, options)

    def resend(self, surface: str, options: Globals) -> str:
        """The command that sends the submit again with its key (see _resume.resend_command)."""
        assert self.key is not None
        return resend_command(self.command, surface, self.request, self.key, self.output, options)


HANDLED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

_received: list[int] = []  # the signal that interrupted the command being run, once one did
_depth = [0]  # commands inside commands (download of several ids) install the handlers once


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    if not _received:
        _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
        return
    # Ctrl-C ignored (a job started in the background by a shell): stop as Python's handler would.
    raise KeyboardInterrupt


@contextmanager
def as_ctrl_c() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP are handled as SIGINT is (unless the process was
    started ignoring one, as ``nohup`` does SIGHUP); the handlers found are put back after it.
    Only the main thread may set handlers: elsewhere (a command run from
    another thread by a program embedding the CLI) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth[0]:
        _depth[0] += 1
        try:
            yield
        finally:
            _depth[0] -= 1
        return
    _received.clear()
    kept: dict[int, Any] = {}
    try:
        for number in HANDLED:
            if signal.getsignal(number) is signal.SIG_IGN:
                continue  # ignored on purpose (nohup ignores SIGHUP): it stays ignored
            kept[number] = signal.signal(number, _as_ctrl_c)
        _depth[0] = 1
        yield
    finally:
        _depth[0] = 0
        for number, handler in kept.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)


def interruption() -> tuple[int, str]:
    """The number and name of the signal that interrupted the command: SIGTERM or SIGHUP if one
    of them came first, else SIGINT (Ctrl-C)."""
    number = _received[0] if _received else int(signal.SIGINT)
    return number, signal.Signals(number).name


@contextmanager
def session(tracked: Optional[Tracked] = None) -> Iterator[Output]:  # noqa: UP045
    """Output for a command, and every error turned into one line and an exit code. With
    --json, a task that failed or is still running at the timeout is printed too (stdout), so
    that a script always has a record to read beside the exit code. SIGTERM and SIGHUP end it
    as Ctrl-C does (:func:`as_ctrl_c`)."""
    with as_ctrl_c(), _session(tracked) as out:
        yield out


@contextmanager
def _session(tracked: Optional[Tracked]) -> Iterator[Output]:  # noqa: UP045
    from imggw_client import (
        FILE_EXISTS,
        DownloadError,
        ImggwError,
        TaskFailedError,
        WaitTimeoutError,
    )

    options = current()
    setup_logging(options)
    out = Output(options)
    try:
        yield out
    except ImggwError as err:
        surface = _surface(tracked, options)
        trace = None
        if options.verbose:
            import traceback

            trace = "".join(traceback.format_exception(err))
            if not _output.is_json():  # else inside the error's JSON object, never lines of its own
                _output.say(trace.rstrip("\n"))  # as every line: the key blanked, controls escaped
                trace = None
        import os

        if out.json and isinstance(err, TaskFailedError):
            out.data(task_record(err.task), [])
        elif out.json and isinstance(err, WaitTimeoutError):
            out.data(unfinished_record(err.task_id, err.last_task), [])
        base_url = options.base_url or os.environ.get("IMGGW_BASE_URL")
        resume, resend = _next_commands(err, tracked, surface, options)
        message = _exit.message_for(
            err, surface=surface, mock=options.mock, base_url=base_url, resume=resume, resend=resend
        )
        if (
            isinstance(err, DownloadError)
            and tracked is not None
            and tracked.command == "generate"  # imggw download itself failed: no hint
            and tracked.id is not None
        ):
            # The task is done and paid for: its results are still to be had, without
            # running generate again (which would pay for a new task).
            there = err.code != FILE_EXISTS and tracked.output is not None
            command = save_command(tracked.id, surface, tracked.output if there else None, options)
            if not there:
                command += " (DIR: another folder, or add --overwrite)"
            message += f"\n  the task succeeded and is paid for; save its results with: {command}"
        condition = _exit.condition_of(err)
        if tracked is not None:
            tracked.condition = condition
        code = _exit.CODES[condition]
        out.error(
            message,
            exit_code=code,
            task_id=_task_of(err, tracked),
            error_code=err.code,
            error_type=type(err).__name__,
            resume=resume,
            traceback=trace,
        )
        raise typer.Exit(code) from None
    except KeyboardInterrupt:
        surface = _surface(tracked, options)
        if tracked is not None and tracked.id is not None:
            resume = tracked.resume(surface, options)
            interrupted(
                out,
                f"interrupted; task {tracked.id} goes on. Resume with: {resume}",
                task_id=tracked.id,
                resume=resume,
            )
        elif tracked is not None and tracked.key is not None:
            hint = _exit.resubmit_hint(tracked.resend(surface, options))
            interrupted(
                out,
                "interrupted during the submit: a task may have been created.\n" + hint,
                idempotency_key=tracked.key,
            )
        else:
            interrupted(out, "interrupted")


def _surface(tracked: Optional[Tracked], options: Globals) -> str:  # noqa: UP045
    """The surface the command's task is on: the one it found, else the options'."""
    found = tracked.surface if tracked is not None else None
    return found or options.chosen_surface


def _next_commands(
    err: Exception,
    tracked: Optional[Tracked],  # noqa: UP045
    surface: str,
    options: Globals,
) -> tuple[Optional[str], Optional[str]]:  # noqa: UP045
    """What goes on after ``err``: the command that picks the task up (any error of a command
    that knows its task, a wait that timed out), and the one that sends a submit whose outcome
    is unknown again with its key; None where none applies."""
    from imggw_client import UnknownOutcomeError, WaitTimeoutError

    resume = resend = None
    if tracked is not None and tracked.id is not None:
        resume = tracked.resume(surface, options)
    elif isinstance(err, WaitTimeoutError):
        resume = wait_command(err.task_id, surface, None, options)
    if isinstance(err, UnknownOutcomeError):
        if tracked is not None and tracked.key == err.idempotency_key:
            resend = tracked.resend(surface, options)
        else:
            request = (err.request.aspect_ratio, err.request.resolution)
            resend = resend_command("submit", surface, request, err.idempotency_key, None, options)
    return resume, resend


def interrupted(out: Output, message: str, **fields: Any) -> NoReturn:
    """Ends a command that Ctrl-C, SIGTERM or SIGHUP interrupted: ``message`` (which starts
    with "interrupted"; another signal than Ctrl-C's is named after that word), the
    ``interrupted`` event with the signal's name, and its exit code (130, 143, 129)."""
    number, name = interruption()
    if name != "SIGINT":
        message = f"interrupted by {name}{message.removeprefix('interrupted')}"
    code = _exit.interrupted_code(number)
    out.error(message, event="interrupted", exit_code=code, signal=name, **fields)
    raise typer.Exit(code) from None


def _task_of(err: Exception, tracked: Optional[Tracked]) -> Optional[str]:  # noqa: UP045
    """The task an error is about, if one is known: for --log-format json's ``task_id``."""
    if tracked is not None and tracked.id is not None:
        return tracked.id
    task = getattr(err, "task", None)
    found = getattr(err, "task_id", None) or getattr(task, "id", None)
    return None if found is None else str(found)


def refuse(message: str) -> NoReturn:
    """A usage error found before anything was read or sent: one line, exit 2."""
    with session() as out:
        out.error(message, event="usage_error", exit_code=_exit.USAGE)
    raise typer.Exit(_exit.USAGE)


STDIN = "-"

# The room a result of each resolution may need (the SDK's figure: a batch checks the same).
RESULT_ROOM = rules.RESULT_ROOM


def ready_folder(folder: Path, out: Output, *, room: int = 0) -> None:
    """The output folder, made if missing, checked writable and with ``room`` bytes free,
    before anything is paid for."""
    import os
    import shutil

    if folder.exists() and not folder.is_dir():
        out.error(
            f"-o {folder}: a file is there, not a folder; nothing was sent", exit_code=_exit.USAGE
        )
        raise typer.Exit(_exit.USAGE)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        out.error(
            f"cannot create {folder}: {exc.strerror}; nothing was sent",
            exit_code=_exit.AUTH_OR_CONFIG,
        )
        raise typer.Exit(_exit.AUTH_OR_CONFIG) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        out.error(
            f"cannot write in {folder}: permission denied; nothing was sent",
            exit_code=_exit.AUTH_OR_CONFIG,
        )
        raise typer.Exit(_exit.AUTH_OR_CONFIG)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # a filesystem that cannot tell: the download still checks every write
        return
    if free < room:
        out.error(
            f"{folder} has {free / (1 << 20):.1f} MiB free; a result may need about "
            f"{room >> 20} MiB: make room, then run the same command (nothing was sent)",
            exit_code=_exit.AUTH_OR_CONFIG,
        )
        raise typer.Exit(_exit.AUTH_OR_CONFIG)


def resolve_prompt(prompt: str, out: Output) -> str:
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
        out.error(
            f"cannot read standard input: not UTF-8 text ({exc.reason})", exit_code=_exit.USAGE
        )
        raise typer.Exit(_exit.USAGE) from None
    text = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")
    for violation in rules.check_prompt(text):
        out.error(f"the prompt read from standard input {violation.rule}", exit_code=_exit.USAGE)
        raise typer.Exit(_exit.USAGE)
    return text
