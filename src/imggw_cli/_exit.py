"""Exit codes, and the one-line message each error deserves."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imggw_client import ImggwError

OK = 0
TASK_FAILED = 1
USAGE = 2
WAIT_TIMEOUT = 3
AUTH_OR_CONFIG = 4
API_OR_NETWORK = 5
INTERRUPTED = 130

EPILOG = (
    "Exit codes: 0 ok; 1 task failed (or some batch items failed); 2 usage or invalid request; "
    "3 wait timed out, task still running; 4 authentication or configuration (or the output "
    "folder cannot be written); "
    "5 other API or network error, including an unknown submit outcome; 130 interrupted."
)


def code_for(err: ImggwError) -> int:
    import imggw_client as sdk
    from imggw_client._download import FILE_EXISTS, WRITE_FAILED
    from imggw_client.batch import (
        BatchInputError,
        BatchLockedError,
        InputChangedError,
        StorageError,
    )

    if isinstance(err, sdk.TaskFailedError):
        return TASK_FAILED
    if isinstance(err, (BatchInputError, BatchLockedError, InputChangedError)):
        return USAGE
    if isinstance(err, StorageError):  # the place to write is the thing to fix
        return AUTH_OR_CONFIG
    if isinstance(err, sdk.DownloadError) and err.code == FILE_EXISTS:
        return USAGE
    if isinstance(err, sdk.DownloadError) and err.code == WRITE_FAILED:
        return AUTH_OR_CONFIG
    if isinstance(err, sdk.WaitTimeoutError):
        return WAIT_TIMEOUT
    if isinstance(
        err, (sdk.RequestValidationError, sdk.InvalidRequestError, sdk.IdempotencyConflictError)
    ):
        return USAGE
    if isinstance(
        err, (sdk.ConfigurationError, sdk.AuthenticationError, sdk.PermissionDeniedError)
    ):
        return AUTH_OR_CONFIG
    return API_OR_NETWORK


def resubmit_hint(command: str, surface: str, aspect_ratio: str, resolution: str, key: str) -> str:
    """How to send a submit again with its key, so that the gateway replays the task it may
    have made instead of billing a second one."""
    return (
        f"  resubmit safely (no second task) with: imggw {command} PROMPT --surface {surface} "
        f"--aspect-ratio {aspect_ratio} --resolution {resolution} --idempotency-key {key}"
    )


def message_for(err: ImggwError, *, surface: str, mock: bool, base_url: str | None = None) -> str:
    """One actionable line; never the key, never the prompt. What the gateway wrote (its
    message, its reason code) is made printable here, so that it cannot break the line."""
    import imggw_client as sdk
    from imggw_client._core.text import printable

    text = printable(err.message)
    flag = f" --surface {surface}"
    if isinstance(err, sdk.WaitTimeoutError):
        return f"{text}\n  resume with: imggw poll {err.task_id}{flag}"
    if isinstance(err, sdk.UnknownOutcomeError):
        return "the submit's outcome is unknown: a task may have been created.\n" + resubmit_hint(
            "submit", surface, err.request.aspect_ratio, err.request.resolution, err.idempotency_key
        )
    if isinstance(err, sdk.AuthenticationError):
        return f"the API key was refused ({err.status_code}): set IMGGW_API_KEY to a valid key"
    if isinstance(err, sdk.NotFoundError) and mock:
        return (
            f"{text.rstrip('.')}: --mock starts a fresh gateway for every command; to keep "
            "tasks between commands, run `imggw mock serve` and point --base-url at it"
        )
    if isinstance(err, sdk.APIConnectionError) and base_url:
        return f"{text} at {base_url}; check --base-url / IMGGW_BASE_URL and the network"
    if isinstance(err, sdk.TaskFailedError):
        return text
    text = text.replace("pass overwrite=True", "pass --overwrite")
    code = printable(err.code) if err.code else None
    if code and code not in text:
        return f"{text} ({code})"
    return text
