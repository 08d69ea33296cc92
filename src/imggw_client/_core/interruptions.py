"""A call stopped from outside (a cancellation, Ctrl-C): how its flow learns of it, and what the
caller is told so as to resume without paying twice.

An interruption is never the operation's error: the driver raises it as it came; a submit or a
generate stopped after its request left only adds a note (PEP 678) and one log line naming the
key or the task that may exist, billed.
"""

from __future__ import annotations

import logging
import shlex
from typing import Any

from .config import Surface
from .errors import add_note
from .models import ImageRequest, Submission
from .wire import Flow

log = logging.getLogger("imggw_client")


class DriverError(BaseException):
    """What a flow is thrown when its driver's own step failed (a callback that raised, a
    journal that could not be written): not the flow's error to handle, only its cue to give
    back what it holds and to name on ``error`` what the caller must know (a submit's key, a
    generate's task). A ``BaseException``, so no ``except Exception`` of a flow takes it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def is_interruption(exc: BaseException) -> bool:
    """Whether ``exc`` stops an operation from outside (a cancellation of asyncio, trio or
    anyio, Ctrl-C, ``SystemExit``, the driver's own error) rather than being an error of it;
    never the ``GeneratorExit`` that closes a flow."""
    return not isinstance(exc, (Exception, GeneratorExit))


def interrupt(flow: Flow[Any], exc: BaseException) -> None:
    """Hands a flow what stopped its driver (an interruption as it came, an error of the
    driver's own as a :class:`DriverError`), so that it can say what a caller needs to resume
    (a submit names its key on ``exc``, a generate its task), and closes it. The driver then
    raises ``exc`` itself: nothing here replaces it."""
    try:
        flow.throw(exc if is_interruption(exc) else DriverError(exc))
    except BaseException:
        return
    flow.close()  # it went on instead of stopping: it may not


def carry_key(
    exc: BaseException, request: ImageRequest, surface: Surface, key: str, *, chosen: bool
) -> None:
    """A submit stopped after its request left: ``exc`` gets a note with the key and the call
    that resends it, and one log line says the same (never the prompt nor the API key). A key
    the caller ``chosen`` is one it holds already (a batch's, the CLI's): said at INFO, so a run
    stopping many submits at once does not repeat what it prints itself."""
    exc = exc.error if isinstance(exc, DriverError) else exc
    ratio, resolution = request.aspect_ratio, request.resolution
    options = ("--surface", surface, "--aspect-ratio", ratio, "--resolution", resolution)
    shell = " ".join(shlex.quote(part) for part in (*options, "--idempotency-key", key))
    add_note(
        exc,
        f"imggw: this submit was stopped after its request was sent: a task may exist, "
        f"billed, under idempotency_key={key!r}. Resend it with that key to get the same task "
        f"without paying twice: client.submit(PROMPT, aspect_ratio={ratio!r}, "
        f"resolution={resolution!r}, surface={surface!r}, idempotency_key={key!r}) or "
        f"imggw submit PROMPT {shell}",
    )
    log.log(
        logging.INFO if chosen else logging.WARNING,
        "a submit was stopped (%s) after its request was sent: a task may exist, billed; "
        "resend it with idempotency_key=%r on surface %s to get that task without paying twice",
        type(exc).__name__,
        key,
        surface,
    )


def carry_task(exc: BaseException, submission: Submission) -> None:
    """A generate stopped while it waited: its task runs on, billed, and its caller never saw
    the id. As :func:`carry_key`: a note and one WARNING, with the id and the key."""
    exc = exc.error if isinstance(exc, DriverError) else exc
    task_id, surface = submission.task_id, submission.surface
    add_note(
        exc,
        f"imggw: task {task_id} (surface {surface}, idempotency_key="
        f"{submission.idempotency_key!r}) was created and goes on, billed. Wait on it instead "
        f"of submitting again: client.wait({task_id!r}, surface={surface!r}) or "
        f"imggw poll {task_id} --surface {surface}",
    )
    log.warning(
        "generate was stopped (%s) while waiting: task %s (surface %s, idempotency_key=%r) goes "
        "on, billed; wait on it instead of submitting again",
        type(exc).__name__,
        task_id,
        surface,
        submission.idempotency_key,
    )
