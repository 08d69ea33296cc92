"""Exit codes, and the one-line message each error deserves.

A command exits by condition (DESIGN 18), whatever else is on its command line: each condition
has one code, on every command. A command of several tasks (``download ID...``) exits with the
code of the first condition of :data:`PRECEDENCE` that one of them met.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imggw_client import ImggwError

OK = 0
TASK_FAILED = 1
USAGE = 2
WAIT_TIMEOUT = 3
AUTH_OR_CONFIG = 4
API_OR_NETWORK = 5
STOPPED = 6  # credits ran out, or a batch guard stopped new submits (lines sent were finished)
# A signal (Ctrl-C, SIGTERM, SIGHUP): 128 + its number, see interrupted_code.


class Condition(enum.Enum):
    """How a command, or one task of several, ended; :data:`CODES` gives each its exit code."""

    OK = "ok"
    CONFIG = "config"  # the key, the configuration, or a folder that cannot be written
    CREDITS = "credits"  # the account has no credits left (402)
    USAGE = "usage"  # a usage error, an invalid request, a file there with other bytes
    UNKNOWN_TASK = "unknown_task"  # the key cannot see the task (404 on a query)
    UNFINISHED = "unfinished"  # the wait ended (or was not asked for) before the task did
    FAILED = "failed"  # the task failed, or its results expired
    ERROR = "error"  # any other API or network error, an unknown submit outcome included


CODES = {
    Condition.OK: OK,
    Condition.CONFIG: AUTH_OR_CONFIG,
    Condition.CREDITS: STOPPED,
    Condition.USAGE: USAGE,
    Condition.UNKNOWN_TASK: TASK_FAILED,
    Condition.UNFINISHED: WAIT_TIMEOUT,
    Condition.FAILED: TASK_FAILED,
    Condition.ERROR: API_OR_NETWORK,
}

# Which condition a command of several tasks exits with, the first met: what stops every task
# (the key or configuration, the credits, the usage) first; then a task the key cannot see,
# which no later run mends (a wait-and-retry loop on 3 would never end); then unfinished tasks,
# which a later run resumes; then tasks that failed or expired; a transient error last.
PRECEDENCE = (
    Condition.CONFIG,
    Condition.CREDITS,
    Condition.USAGE,
    Condition.UNKNOWN_TASK,
    Condition.UNFINISHED,
    Condition.FAILED,
    Condition.ERROR,
)

EPILOG = (
    "Exit codes: 0 ok; 1 a task failed, its results expired, or the key cannot see it (no such "
    "task); 2 usage or invalid request; 3 wait timed out, task still running (run again later "
    "to resume); 4 authentication or configuration (or the output folder cannot be written); "
    "5 other API or network error, including an unknown submit outcome; "
    "6 credits ran out (any command), or a batch guard stopped new submits (a spend cap, "
    "--max-failures): top up or raise the limit, then run the same command again; "
    "130 interrupted (Ctrl-C), 143 SIGTERM, 129 SIGHUP: the message says how to resume. "
    "Several task ids exit with the first that applies of 4, 6, 2, 1 (no such task), 3, "
    "1 (failed or expired), 5."
)


def condition_of(err: ImggwError) -> Condition:
    """The condition an error is, the same on every command."""
    import imggw_client as sdk
    from imggw_client.batch import (
        BatchInputError,
        BatchLockedError,
        InputChangedError,
        StorageError,
    )

    if isinstance(err, (sdk.TaskFailedError, sdk.ResultExpiredError)):
        return Condition.FAILED
    if isinstance(err, sdk.InsufficientCreditsError):
        return Condition.CREDITS
    if isinstance(err, sdk.NotFoundError):
        return Condition.UNKNOWN_TASK
    if isinstance(err, (BatchInputError, BatchLockedError, InputChangedError)):
        return Condition.USAGE
    if isinstance(err, StorageError):  # the place to write is the thing to fix
        return Condition.CONFIG
    if isinstance(err, sdk.DownloadError) and err.code == sdk.FILE_EXISTS:
        return Condition.USAGE
    if isinstance(err, sdk.DownloadError) and err.code == sdk.WRITE_FAILED:
        return Condition.CONFIG
    if isinstance(err, sdk.WaitTimeoutError):
        return Condition.UNFINISHED
    if isinstance(
        err, (sdk.RequestValidationError, sdk.InvalidRequestError, sdk.IdempotencyConflictError)
    ):
        return Condition.USAGE
    if isinstance(
        err, (sdk.ConfigurationError, sdk.AuthenticationError, sdk.PermissionDeniedError)
    ):
        return Condition.CONFIG
    return Condition.ERROR


def condition_of_code(code: int) -> Condition:
    """The condition a command's own exit code stands for (a check made before any request,
    such as a folder that cannot be written); 1 is read as a failed task."""
    if code == TASK_FAILED:
        return Condition.FAILED
    return next((c for c in PRECEDENCE if CODES[c] == code), Condition.ERROR)


def several(conditions: Iterable[Condition]) -> int:
    """The exit code of a command of several tasks, from how each ended: the first condition
    of :data:`PRECEDENCE` met, else 0.
    """
    met = set(conditions)
    return next((CODES[c] for c in PRECEDENCE if c in met), OK)


def interrupted_code(signal_number: int) -> int:
    """The exit code of a command a signal interrupted, as shells report one: 128 + its number
    (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
    return 128 + signal_number


def is_interrupted(code: int) -> bool:
    """Whether an exit code is a signal's (see :func:`interrupted_code`)."""
    return code > 128


def resubmit_hint(command: str) -> str:
    """The line naming ``command``, which sends a submit again with its key, so that the
    gateway replays the task it may have made instead of billing a second one."""
    return f"  resubmit safely (no second task) with: {command}"


def message_for(
    err: ImggwError,
    *,
    surface: str,
    mock: bool,
    base_url: str | None = None,
    resume: str | None = None,
    resend: str | None = None,
) -> str:
    """One actionable line; never the key, never the prompt. What the gateway wrote (its
    message, its reason code) is made printable here, so that it cannot break the line.
    ``resume`` is the command that picks up a wait that timed out (the command's own choice:
    ``poll`` only waits, ``download --wait`` also saves); ``resend`` the one that sends a
    submit of unknown outcome again with its key (see _resume)."""
    import imggw_client as sdk
    from imggw_client.text import printable

    text = printable(err.message)
    if isinstance(err, sdk.WaitTimeoutError) and resume is not None:
        return f"{text}\n  resume with: {resume}"
    if isinstance(err, sdk.UnknownOutcomeError) and resend is not None:
        return "the submit's outcome is unknown: a task may have been created.\n" + resubmit_hint(
            resend
        )
    if isinstance(err, sdk.AuthenticationError):
        return f"the API key was refused ({err.status_code}): set IMGGW_API_KEY to a valid key"
    if isinstance(err, sdk.InsufficientCreditsError):
        said = f"{text} ({printable(err.code)})" if err.code else text
        return f"{said}: top up the account, then run the same command again"
    if isinstance(err, sdk.ConfigurationError) and err.code == sdk.MISSING_API_KEY:
        return "no API key: set IMGGW_API_KEY (the command line reads the key nowhere else)"
    if isinstance(err, sdk.ConfigurationError) and err.code == sdk.MISSING_BASE_URL:
        return "no base URL: pass --base-url or set IMGGW_BASE_URL (or try --mock)"
    if isinstance(err, sdk.NotFoundError) and mock:
        return (
            f"{text.rstrip('.')}: --mock starts a fresh gateway for every command; to keep "
            "tasks between commands, run `imggw mock serve` and point --base-url at it"
        )
    if isinstance(err, sdk.NotFoundError) and base_url:
        reason = f" ({printable(err.code)})" if err.code else ""
        return (
            f"{text}{reason} at {printable(base_url)} on surface {surface}: check the task id, "
            "--surface and --base-url"
        )
    if isinstance(err, sdk.APIConnectionError) and base_url:
        proxy = proxy_for(base_url)
        if proxy is not None:
            where, variable = proxy
            return (
                f"{text} at {printable(base_url)} through the proxy {printable(where)} (from "
                f"{variable}); check that proxy (or unset {variable}), --base-url and the network"
            )
        return f"{text} at {base_url}; check --base-url / IMGGW_BASE_URL and the network"
    if isinstance(err, sdk.TaskFailedError):
        return text
    # The SDK's words for its keyword arguments, as the command line spells them.
    text = text.replace("pass overwrite=True", "pass --overwrite")
    text = text.replace("leave idempotency_key out", "leave --idempotency-key out")
    if text.startswith("idempotency_key: "):
        text = "--" + text.replace("_", "-", 1)
    code = printable(err.code) if err.code else None
    if code and code not in text:
        return f"{text} ({code})"
    return text


def proxy_for(base_url: str) -> tuple[str, str] | None:
    """The proxy the environment routes ``base_url`` through, as httpx reads it (``HTTPS_PROXY``,
    ``HTTP_PROXY``, ``ALL_PROXY``, any case, unless ``NO_PROXY`` names the host), and the
    variable it came from; credentials in it are left out. None when there is none."""
    import os
    import urllib.parse

    split = urllib.parse.urlsplit(base_url)
    if _bypassed(split.hostname or "", os.environ.get("NO_PROXY") or os.environ.get("no_proxy")):
        return None
    for scheme in (split.scheme, "all"):
        for name in (f"{scheme}_proxy".upper(), f"{scheme}_proxy"):
            value = os.environ.get(name)
            if value:
                proxy = urllib.parse.urlsplit(value if "://" in value else f"http://{value}")
                netloc = proxy.netloc.rpartition("@")[2]  # never the proxy's credentials
                return f"{proxy.scheme}://{netloc}", name
    return None


def _bypassed(host: str, no_proxy: str | None) -> bool:
    for entry in (no_proxy or "").split(","):
        entry = entry.strip().lower().lstrip(".")
        if entry == "*" or (entry and (host == entry or host.endswith("." + entry))):
            return True
    return False
