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
STOPPED = 6  # a batch guard stopped new submits (its lines sent were finished)
INTERRUPTED = 130

EPILOG = (
    "Exit codes: 0 ok; 1 task failed (or some batch items failed); 2 usage or invalid request; "
    "3 wait timed out, task still running; 4 authentication or configuration (or the output "
    "folder cannot be written); "
    "5 other API or network error, including an unknown submit outcome; "
    "6 stopped by a batch guard (a spend cap, --max-failures, or credits ran out: raise the "
    "limit or top up, then run the same command again); "
    "130 interrupted."
)


def code_for(err: ImggwError) -> int:
    import imggw_client as sdk
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
    if isinstance(err, sdk.DownloadError) and err.code == sdk.FILE_EXISTS:
        return USAGE
    if isinstance(err, sdk.DownloadError) and err.code == sdk.WRITE_FAILED:
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


# Which item's code a download of several tasks exits with: what stops every item (the key, the
# configuration, the usage) first, then what a later run resumes (unfinished), then failures.
_DOWNLOAD_PRECEDENCE = (AUTH_OR_CONFIG, USAGE, WAIT_TIMEOUT, TASK_FAILED)


def download_code(codes: list[int]) -> int:
    """The exit code of ``imggw download ID...`` from each task's: an item that could not be had
    (an unknown task, a network error) among others that could is "some items failed" (1);
    only when every item met the same API or network error is that the command's code (5)."""
    failed = [c for c in codes if c != OK]
    if not failed:
        return OK
    if all(c == API_OR_NETWORK for c in codes):
        return API_OR_NETWORK
    failed = [TASK_FAILED if c == API_OR_NETWORK else c for c in failed]
    return min(failed, key=_DOWNLOAD_PRECEDENCE.index)


def resubmit_hint(command: str, surface: str, aspect_ratio: str, resolution: str, key: str) -> str:
    """How to send a submit again with its key, so that the gateway replays the task it may
    have made instead of billing a second one."""
    return (
        f"  resubmit safely (no second task) with: imggw {command} PROMPT --surface {surface} "
        f"--aspect-ratio {aspect_ratio} --resolution {resolution} --idempotency-key {key}"
    )


def message_for(
    err: ImggwError,
    *,
    surface: str,
    mock: bool,
    base_url: str | None = None,
    resume: str | None = None,
) -> str:
    """One actionable line; never the key, never the prompt. What the gateway wrote (its
    message, its reason code) is made printable here, so that it cannot break the line.
    ``resume`` is the command that picks up a wait that timed out (the command's own choice:
    ``poll`` only waits, ``download --wait`` also saves)."""
    import imggw_client as sdk
    from imggw_client.text import printable

    text = printable(err.message)
    flag = f" --surface {surface}"
    if isinstance(err, sdk.WaitTimeoutError):
        return f"{text}\n  resume with: {resume or f'imggw poll {err.task_id}{flag}'}"
    if isinstance(err, sdk.UnknownOutcomeError):
        return "the submit's outcome is unknown: a task may have been created.\n" + resubmit_hint(
            "submit", surface, err.request.aspect_ratio, err.request.resolution, err.idempotency_key
        )
    if isinstance(err, sdk.AuthenticationError):
        return f"the API key was refused ({err.status_code}): set IMGGW_API_KEY to a valid key"
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
    text = text.replace("pass overwrite=True", "pass --overwrite")
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
