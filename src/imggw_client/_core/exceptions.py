"""The imggw error tree.

Every error the SDK raises is an :class:`ImggwError`::

    ImggwError                          status_code, code, message, surface on every error
    ├── ConfigurationError              missing key or base URL, bad option values, or a base
    │                                   URL whose submit route answers 404 (nothing was made)
    ├── ClientClosedError               the client was closed (before or during the call)
    ├── RequestValidationError          (a ValueError too) a request broke a rule; names the field
    ├── APIConnectionError              the gateway could not be reached (retries exhausted)
    │   └── APITimeoutError             ... because requests timed out
    ├── APIError                        the gateway answered with an error
    │   ├── InvalidRequestError         400, 413, 422: the request was refused as invalid
    │   ├── AuthenticationError         401
    │   ├── InsufficientCreditsError    402
    │   ├── PermissionDeniedError       403
    │   ├── NotFoundError               404: unknown task, or one that belongs to another key
    │   ├── ConflictError               409: the same key is still being processed (retried)
    │   ├── IdempotencyConflictError    the key was already used for a different request
    │   ├── RateLimitError              429 (carries retry_after)
    │   └── ServerError                 5xx, or a response that could not be understood
    ├── UnknownOutcomeError             a submit may or may not have created a task: resend it
    │                                   with client.submit(err) (same request, key and surface)
    ├── TaskFailedError                 the task ended failed or cancelled (carries the task)
    ├── WaitTimeoutError                the wait's deadline passed while the task was still active:
    │                                   wait again with client.wait(err) (same task and surface)
    ├── ResultExpiredError              a result link answered 403/404/410: retention is over
    └── DownloadError                   a result could not be downloaded or saved

``WaitTimeoutError`` is deliberately *not* a ``TaskFailedError``: a slow task is not a failed one,
and the task can be waited on again with ``client.wait(err)``.

The recovery recipes take the error itself, so they ask the surface the first call used (a
per-call ``surface=`` included): ``client.wait(err)`` (or ``client.wait(err.submission)``)
after a ``WaitTimeoutError``, ``client.submit(err)`` after an ``UnknownOutcomeError``, which
sends the identical request with the same key, so the gateway replays the task it may have made
instead of billing a second one. Every error survives ``pickle`` with all its fields: one
raised in a worker process (``ProcessPoolExecutor``, ``multiprocessing``, Dask) reaches the
parent whole, its recipe still working there.

A submit cancelled (``asyncio.timeout``, an anyio cancel scope) or interrupted (Ctrl-C) after
its request left may have made a task: the exception that ends it gets a note (PEP 678) naming
the ``idempotency_key`` and the call that resends it without paying twice, and the SDK logs one
WARNING on the ``imggw_client`` logger with that key.

Messages are safe to log and show: they never contain the API key, the prompt, or a raw
upstream body. Example::

    try:
        task = client.generate("a lighthouse at dusk", surface="alpha")
    except imggw_client.WaitTimeoutError as err:
        task = client.wait(err)        # still running: keep waiting on alpha, never resubmit
    except imggw_client.UnknownOutcomeError as err:
        sub = client.submit(err)       # the same request and key on alpha: replayed, not billed
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import reasons

# The two errors the models raise live in ``errors``, which imports nothing, so that the models
# never import this module while it imports them for annotations; here is their public home.
from .errors import ImggwError, RequestValidationError

if TYPE_CHECKING:
    from .models import ImageRequest, Submission, Task

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AuthenticationError",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "DownloadError",
    "IdempotencyConflictError",
    "ImggwError",
    "InsufficientCreditsError",
    "InvalidRequestError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestValidationError",
    "ResultExpiredError",
    "ServerError",
    "TaskFailedError",
    "UnknownOutcomeError",
    "WaitTimeoutError",
]


class ConfigurationError(ImggwError):
    """The client is misconfigured: no API key, no base URL, an invalid option, or a base URL
    whose submit route answers 404 (a submit names no task, so only a wrong base URL can make
    it miss; nothing was created and nothing is retried).

    Example::

        try:
            Client(base_url="gateway.example")   # no scheme: refused before anything is sent
        except ConfigurationError as err:
            print(err.code, err.message)
    """


class ClientClosedError(ImggwError):
    """The client was closed, before the call or while it ran (``close()`` from another thread
    or task). ``request_sent`` tells whether the interrupted request may have reached the
    gateway; a *submit* that may have raises :class:`UnknownOutcomeError` instead.

    Example::

        client.close()
        try:
            client.get(task.id)
        except ClientClosedError:
            client = Client()   # a closed client stays closed: make a new one
    """

    def __init__(self, message: str, *, request_sent: bool = False) -> None:
        super().__init__(message, code="client_closed")
        self.request_sent = request_sent


class APIConnectionError(ImggwError):
    """The gateway could not be reached, or the connection broke, and retries ran out.

    ``request_sent`` tells whether the last request may have reached the gateway. A *submit*
    that may have reached it raises :class:`UnknownOutcomeError` instead.

    Example::

        try:
            task = client.get(task.id)
        except APIConnectionError:
            ...  # network down; safe to call client.get() again later
    """

    def __init__(self, message: str, *, request_sent: bool, surface: str | None = None) -> None:
        super().__init__(message, surface=surface)
        self.request_sent = request_sent


class APITimeoutError(APIConnectionError):
    """Requests to the gateway timed out and retries ran out.

    Example::

        try:
            task = client.get(task.id)
        except APITimeoutError:
            ...  # raise Client(timeout=...) or try again later
    """


class APIError(ImggwError):
    """The gateway answered with an error. ``retry_after`` holds its ``Retry-After`` hint, if any.

    ``code`` is one word per condition on both surfaces: the reason the answer names, else
    (surface A names none, nor does a proxy's error page) the one surface B sends for its
    status: 400/422 ``invalid_request``, 401 ``unauthorized``, 402 ``insufficient_credits``,
    403 ``forbidden``, 404 ``task_not_found``, 409 ``idempotency_in_progress``, 429
    ``rate_limited``, 5xx ``server_error``.

    Example::

        try:
            task = client.get("12345", surface="alpha")
        except APIError as err:
            log.warning("gateway said %s (%s)", err.code, err.status_code)
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        surface: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, code=code, surface=surface)
        self.retry_after = retry_after


class InvalidRequestError(APIError):
    """The gateway refused the request as invalid (400, 413, 422).

    Example::

        try:
            client.submit("a cat", aspect_ratio="7:5", validate=False)   # the gateway judges
        except InvalidRequestError as err:
            print(err.code, err.message)   # fix the request; retrying it will not help
    """


class AuthenticationError(APIError):
    """The API key was missing or refused (401). Check ``IMGGW_API_KEY``.

    Example::

        try:
            Client(api_key="sk-not-this-one").get(task.id)
        except AuthenticationError:
            print("check IMGGW_API_KEY")
    """


class InsufficientCreditsError(APIError):
    """The account has no credits left for this request (402).

    Example::

        try:
            sub = client.submit("a lighthouse at dusk", aspect_ratio="16:9", resolution="4k")
        except InsufficientCreditsError:
            print("top up the account, then submit again")
    """


class PermissionDeniedError(APIError):
    """The key may not do this (403).

    Example::

        try:
            task = client.get(task.id)
        except PermissionDeniedError as err:
            print(err.message)
    """


class NotFoundError(APIError):
    """No such task for this key (404). The gateway does not say whether another key owns it.
    ``task_id`` is the task asked for (None when the 404 was not a task's query).

    Example::

        try:
            client.get("12345", surface="alpha")
        except NotFoundError as err:
            print(err.task_id)  # wrong id, wrong surface, another key's task, or one forgotten
    """

    task_id: str | None = None


class ConflictError(APIError):
    """The same idempotency key is still being processed (409); the SDK retries it.

    Seen only when retries run out on a query; a submit then raises UnknownOutcomeError.

    Example::

        try:
            sub = client.submit("a lighthouse at dusk", idempotency_key=sub.idempotency_key)
        except ConflictError:
            ...  # the first request is still running; try again shortly
    """


class IdempotencyConflictError(APIError):
    """The idempotency key was already used with a different request; never retried.

    Example::

        try:
            client.submit("another prompt", idempotency_key=sub.idempotency_key)
        except IdempotencyConflictError:
            sub = client.submit("another prompt")   # a new request needs a new key
    """


class RateLimitError(APIError):
    """Too many requests (429). ``retry_after`` is the server's hint in seconds, if any.

    Raised when retries run out or when the hint is longer than
    ``RetryPolicy.max_retry_after``.

    Example::

        try:
            task = client.get(task.id)
        except RateLimitError as err:
            time.sleep(err.retry_after or 30)
    """


class ServerError(APIError):
    """The gateway failed (5xx) or sent a response that could not be understood.

    Example::

        try:
            task = client.get(task.id)
        except ServerError as err:
            print(err.status_code, err.code)   # code "malformed_response" for garbage
    """


class UnknownOutcomeError(ImggwError):
    """Retries ran out while a submit's outcome was unknown: a task may or may not exist.

    ``client.submit(err)`` resends it: the identical ``request`` with the same
    ``idempotency_key``, on the same ``surface``, so the gateway replays the first task
    instead of creating (and billing) a second one. No task is known, so ``submission`` is
    None (the attribute is there, as on :class:`WaitTimeoutError`, for code that handles both):
    a wait needs the one that resend returns. It survives ``pickle`` (from a worker process,
    say) with every field.

    Example::

        try:
            sub = client.submit("a lighthouse at dusk")
        except UnknownOutcomeError as err:
            sub = client.submit(err)     # replayed if the first one made a task
        task = client.wait(sub)
    """

    def __init__(
        self,
        message: str,
        *,
        idempotency_key: str,
        request: ImageRequest,
        surface: str,
        status_code: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, code=code, surface=surface)
        self.idempotency_key = idempotency_key
        self.request = request
        # No task id is known after an unknown outcome, so no Submission can be named.
        self.submission: Submission | None = None


def _kept_by_error(task: Task) -> Task:
    """``task`` as an error keeps it: every field but ``raw`` (left empty). The gateway's
    record as received may echo the API key, which the error's message blanks but a pickle of
    the error (sent from a worker process) or a dump of its task would write out whole; and it
    may nest deeper than ``pickle`` can go, when every error must survive it. A task a call
    returns or yields keeps its record."""
    return task.model_copy(update={"raw": {}}) if task.raw else task


class TaskFailedError(ImggwError):
    """The task reached a terminal failure (failed or cancelled). ``task.error`` has details;
    ``task.raw`` is empty: the gateway's record may echo the API key, which a pickled error
    or a dump of its task would otherwise carry.

    Example::

        try:
            task = client.generate("a lighthouse at dusk")
        except TaskFailedError as err:
            print(err.task.id, err.code, err.message)
    """

    def __init__(self, task: Task) -> None:
        error = task.error
        code = error.code if error else None
        text = error.message if error else "no reason given"
        super().__init__(f"task {task.id} failed: {text} ({code})", code=code, surface=task.surface)
        self.task = _kept_by_error(task)


class WaitTimeoutError(ImggwError):
    """The wait's deadline passed while the task was still active. This is not a failure.

    ``task_id`` and ``surface`` identify the task; ``last_task`` is the last state seen (None
    if no query succeeded; its ``raw`` empty, as a :class:`TaskFailedError`'s task's is);
    ``submission`` is the :class:`Submission` the wait was given (by ``generate``, or
    ``wait(sub)``), None when it was given a bare task id or a ``Task``, whose key it never
    knew. ``timeout`` is the wait's. From ``as_completed``, ``still_running`` is
    the id of every task it left running (this one first; empty from a single wait), and the
    message names them (the first :data:`NAMED_RUNNING`, then how many more). Wait again with
    ``client.wait(err)``: it asks the task's own surface (a per-call ``surface=`` included)
    and, from a submission, keeps polling by what the client learned of such tasks. Never
    resubmit. It survives ``pickle`` (from a worker process, say) with every field.

    Example::

        try:
            task = client.generate("a lighthouse at dusk", wait_timeout=600)
        except WaitTimeoutError as err:
            task = client.wait(err, wait_timeout=3600)   # the same task, never a new one
    """

    def __init__(
        self,
        task_id: str,
        last_task: Task | None,
        *,
        timeout: float,
        surface: str | None = None,
        submission: Submission | None = None,
        still_running: Sequence[str] = (),
    ) -> None:
        if surface is None:
            known = submission if submission is not None else last_task
            surface = known.surface if known is not None else None
        running = tuple(still_running)
        if len(running) > 1:
            message = (
                f"{len(running)} tasks still active after waiting {timeout:g}s: "
                f"{_named(running)}; they may still succeed: wait on them again "
                "(still_running holds their ids)"
            )
        else:
            seen = f", last seen {last_task.status.value}" if last_task is not None else ""
            message = (
                f"task {task_id} still active after waiting {timeout:g}s{seen}; "
                "it may still succeed: wait on it again"
            )
        super().__init__(message, surface=surface)
        self.task_id = task_id
        self.last_task = None if last_task is None else _kept_by_error(last_task)
        self.timeout = timeout
        self.submission = submission
        self.still_running = running


# The task ids a WaitTimeoutError's message names at most: thousands left running would
# otherwise make one log line of megabytes (``still_running`` holds every one).
NAMED_RUNNING = 10


def _named(task_ids: tuple[str, ...]) -> str:
    """The first :data:`NAMED_RUNNING` ids, then how many more there are."""
    shown = ", ".join(task_ids[:NAMED_RUNNING])
    more = len(task_ids) - NAMED_RUNNING
    return f"{shown} and {more} more" if more > 0 else shown


class ResultExpiredError(ImggwError):
    """A result link answered 403, 404 or 410: the retention window is over.

    Example::

        try:
            files = client.download(task, "out/")
        except ResultExpiredError:
            ...  # the image is gone; download sooner next time
    """


class DownloadError(ImggwError):
    """A result could not be downloaded or saved (network, size mismatch, file exists, ...).

    Example::

        files = client.download(task, "out/")
        try:
            files = client.download(task, "out/")
        except DownloadError as err:
            print(err.code)   # "exists": pass overwrite=True to replace the files
    """


# The class of an error answer by its HTTP status, as the tree above draws it.
_BY_STATUS: dict[int, type[APIError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    402: InsufficientCreditsError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidRequestError,
    422: InvalidRequestError,
    429: RateLimitError,
}


def answer_class(status: int, reason: str | None) -> type[APIError]:
    """The class of the error a gateway's error answer raises: by its reason where the reason
    decides (a reused key, an idempotency check that could not run), else by its status.
    """
    if reason == reasons.IDEMPOTENCY_KEY_REUSED.code:
        return IdempotencyConflictError
    if reason == reasons.IDEMPOTENCY_UNAVAILABLE.code or status >= 500:
        return ServerError
    return _BY_STATUS.get(status, APIError)
