"""imggw: the Python SDK for the imggw asynchronous image-generation gateway.

Example::

    from imggw_client import Client

    with Client() as client:                       # IMGGW_API_KEY, IMGGW_BASE_URL
        task = client.generate("a lighthouse at dusk", aspect_ratio="16:9")
        for f in client.download(task, "out/"):
            print(f.path, f.sha256)

Beside the gateway's reason codes, an error of the SDK's own carries one of these in ``.code``:
``FILE_EXISTS`` (a :class:`DownloadError`: a file of that name is there and ``overwrite`` was
not asked for), ``WRITE_FAILED`` (a :class:`DownloadError`: the disk refused; downloading
again will not help), ``MISSING_API_KEY`` and ``MISSING_BASE_URL`` (a
:class:`ConfigurationError`: neither the argument nor the environment gave one).

Example::

    import imggw_client

    try:
        client.download(task, "out/")
    except imggw_client.DownloadError as err:
        if err.code != imggw_client.FILE_EXISTS:
            raise
        client.download(task, "out/again/")

The request's choices are types, for a type checker to hold code to what the gateway takes:
``Surface`` (``"alpha"``, ``"beta"``), ``AspectRatio`` (the 16 ratios of
``imggw_client.rules.ASPECT_RATIOS``) and ``Resolution`` (``"1k"``, ``"2k"``, ``"4k"``, in either
case), each a ``typing.Literal``; every signature that takes one is typed with it.

Example::

    from imggw_client import AspectRatio, Resolution, Surface

    def poster(client: Client, ratio: AspectRatio = "2:3", size: Resolution = "2k") -> Task:
        return client.generate("a poster", aspect_ratio=ratio, resolution=size)

    poster(client, "3:2")
    try:
        poster(client, "7:5")    # mypy: incompatible type "Literal['7:5']"
    except RequestValidationError:
        ...                      # and at run time, before anything is sent

Logging: the ``imggw_client`` logger has a ``NullHandler``, so an application that sets up no
logging hears nothing from it. ``IMGGW_LOG=debug`` (or ``info``) in the environment writes its
records to stderr, as ``OPENAI_LOG`` does for openai-python; no line holds an API key.

In a shell: ``IMGGW_LOG=debug python app.py`` (every request, retry and note on stderr).
"""

import importlib
from typing import TYPE_CHECKING, Any

from . import _logs
from ._version import __version__

_logs.setup()

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use
    from ._async_client import AsyncClient
    from ._client import Client
    from ._core.budget import BudgetService, SyncBudgetService
    from ._core.config import MISSING_API_KEY, MISSING_BASE_URL, PollPolicy, RateLimit, RetryPolicy
    from ._core.exceptions import (
        APIConnectionError,
        APIError,
        APITimeoutError,
        AuthenticationError,
        ClientClosedError,
        ConfigurationError,
        ConflictError,
        DownloadError,
        IdempotencyConflictError,
        ImggwError,
        InsufficientCreditsError,
        InvalidRequestError,
        NotFoundError,
        PermissionDeniedError,
        RateLimitError,
        RequestValidationError,
        ResultExpiredError,
        ServerError,
        TaskFailedError,
        UnknownOutcomeError,
        WaitTimeoutError,
    )
    from ._core.models import DownloadedFile, ImageRequest, Submission, Task, TaskError, TaskStatus
    from ._core.rules import AspectRatio, Resolution
    from ._core.spec import Surface
    from ._download import FILE_EXISTS, WRITE_FAILED

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AspectRatio",
    "AsyncClient",
    "AuthenticationError",
    "BudgetService",
    "Client",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "DownloadError",
    "DownloadedFile",
    "FILE_EXISTS",
    "IdempotencyConflictError",
    "ImageRequest",
    "ImggwError",
    "InsufficientCreditsError",
    "InvalidRequestError",
    "MISSING_API_KEY",
    "MISSING_BASE_URL",
    "NotFoundError",
    "PermissionDeniedError",
    "PollPolicy",
    "RateLimit",
    "RateLimitError",
    "RequestValidationError",
    "Resolution",
    "ResultExpiredError",
    "RetryPolicy",
    "ServerError",
    "Submission",
    "Surface",
    "SyncBudgetService",
    "Task",
    "TaskError",
    "TaskFailedError",
    "TaskStatus",
    "UnknownOutcomeError",
    "WRITE_FAILED",
    "WaitTimeoutError",
    "__version__",
    "new_idempotency_key",
]

# Where each public name lives. Loading on first use (PEP 562) keeps light entry points, such
# as ``imggw --help``, from paying for httpx and pydantic.
_HOMES = {
    "AsyncClient": "._async_client",
    "Client": "._client",
    "MISSING_API_KEY": "._core.config",
    "MISSING_BASE_URL": "._core.config",
    "PollPolicy": "._core.config",
    "RateLimit": "._core.config",
    "RetryPolicy": "._core.config",
    "BudgetService": "._core.budget",
    "AspectRatio": "._core.rules",
    "Resolution": "._core.rules",
    "Surface": "._core.spec",
    "SyncBudgetService": "._core.budget",
    "FILE_EXISTS": "._download",
    "WRITE_FAILED": "._download",
    **dict.fromkeys(
        ["DownloadedFile", "ImageRequest", "Submission", "Task", "TaskError", "TaskStatus"],
        "._core.models",
    ),
}


def new_idempotency_key() -> str:
    """A fresh idempotency key (128 random bits, as 32 hex characters), as a submit given none
    makes for itself: for code that records a request's key before sending it, so that a crash
    or a lost answer can never make it pay twice (the same key replays the same task).

    Example::

        key = new_idempotency_key()
        Path("next-key.txt").write_text(key)            # kept before anything is sent
        sub = client.submit("a lighthouse", idempotency_key=key)
    """
    from ._core.flows import new_idempotency_key as new  # here: importing the package stays light

    return new()


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_HOMES.get(name, "._core.exceptions"), __name__)
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
